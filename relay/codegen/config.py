"""Settings: ``[tool.relay]`` in the nearest ``pyproject.toml``, as mypy and ruff read theirs.

[tool.relay]
schemas = ["schemas/*.py"]   # files or globs, relative to pyproject.toml
out = "relay/maps"           # where generated modules go
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs

from relay.errors import RelayError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@attrs.frozen
class Config:
    root: Path  # the folder of pyproject.toml
    schemas: tuple[Path, ...]
    out: Path


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start``."""
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def project_root(path: Path) -> Path:
    """The folder of the nearest ``pyproject.toml`` above ``path``, else its folder."""
    start = path if path.is_dir() else path.parent
    pyproject = find_pyproject(start)
    return pyproject.parent if pyproject is not None else start


def load_config(start: Path) -> Config:
    """Read ``[tool.relay]``; raises ``RelayError`` saying what to add when it is absent."""
    pyproject = find_pyproject(start.resolve())
    if pyproject is None:
        raise RelayError(
            f"no pyproject.toml at or above {start}; name the schemas and --out DIR on the "
            "command line, or add [tool.relay] with schemas and out to a pyproject.toml"
        )
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise RelayError(f"{pyproject}: not valid TOML: {error}") from None
    section = data.get("tool", {}).get("relay")
    if not isinstance(section, dict):
        raise RelayError(
            f"{pyproject} has no [tool.relay] section; add one, e.g. [tool.relay] with "
            'schemas = ["schemas/*.py"] and out = "relay/maps", or name the schemas and '
            "--out DIR on the command line"
        )
    root = pyproject.parent
    patterns = section.get("schemas")
    out = section.get("out")
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise RelayError(
            f"{pyproject}: [tool.relay] schemas must be a list of paths or globs"
        )
    if not isinstance(out, str):
        raise RelayError(
            f"{pyproject}: [tool.relay] out must be a folder path (a string)"
        )
    schemas: list[Path] = []
    for pattern in patterns:
        matches = (
            sorted(root.glob(pattern))
            if any(c in pattern for c in "*?[")
            else [root / pattern]
        )
        for match in matches:
            if match.name != "__init__.py" and match not in schemas:
                schemas.append(match)
    return Config(root=root, schemas=tuple(schemas), out=root / out)
