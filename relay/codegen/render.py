"""Rendering: one validated schema -> the body of its generated module (``files`` adds the header)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jinja2

from relay.codegen import files
from relay.codegen.formatting import FormatError, format_module, ruff_binary
from relay.codegen.views import MapView, map_view
from relay.errors import RelayError
from relay.schema import Schema


class BrokenModule(RelayError):
    """A generated module Python cannot compile: a generator bug a schema exposed.

    ``api.plan`` turns it into a located schema issue (exit 3); nothing is written.
    """

    def __init__(self, reason: str, lineno: int | None, line: str) -> None:
        self.reason = reason
        self.lineno = lineno
        self.line = line
        super().__init__(f"line {lineno}: {reason}: {line.strip()}")


def compiled(text: str, name: str) -> None:
    """``BrokenModule`` unless Python compiles ``text`` (Note [Compiled before written])."""
    try:
        compile(text, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        lineno = getattr(error, "lineno", None)
        lines = text.splitlines()
        line = lines[lineno - 1] if lineno and 0 < lineno <= len(lines) else ""
        reason = getattr(error, "msg", None) or str(error)
        raise BrokenModule(f"{type(error).__name__}: {reason}", lineno, line) from None


#: pyflakes' rules for names: undefined, used before assignment, redefined, unused.
_NAME_RULES = "F811,F821,F822,F823,F841"
_FINDING = re.compile(r":(\d+):\d+: (F\d+ .*)")


def names_bound(text: str, name: str) -> None:
    """``BrokenModule`` where ``text`` reads a name it never binds or binds it after
    use (pyflakes' rules, as ``ruff check`` runs them): what compiling cannot see."""
    try:
        done = subprocess.run(
            [str(ruff_binary()), "check", "--isolated", "--select", _NAME_RULES]
            + ["--output-format", "concise", "--stdin-filename", "map.py", "-"],
            input=text.encode("utf-8"),
            capture_output=True,
            check=False,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise FormatError(f"{name}: ruff check could not run: {error}") from error
    found = _FINDING.search(done.stdout.decode("utf-8", "replace"))
    if done.returncode != 0 and found is not None:
        lineno = int(found.group(1))
        lines = text.splitlines()
        line = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
        raise BrokenModule(found.group(2), lineno, line)
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip()
        raise FormatError(f"{name}: ruff check refused the generated module: {reason}")


TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE = "map.py.jinja"


def environment(
    cls: type[jinja2.Environment] = jinja2.Environment,
) -> jinja2.Environment:
    """The Jinja environment of the generator (``cls`` lets tests instrument it)."""
    return cls(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


_ENV = environment()


def render_body(view: MapView, env: jinja2.Environment | None = None) -> str:
    """The module text of ``view`` below the header: LF line ends, one trailing newline."""
    template = (env or _ENV).get_template(TEMPLATE)
    return template.render(m=view).rstrip("\n") + "\n"


def render(
    schema: Schema, *, source: str, command: str, schema_hash: str | None = None
) -> str:
    """The whole generated module of a validated ``schema``, header included: the
    template's statements laid out by the pinned formatter (Note [Formatter pin])."""
    # Note [Compiled before written]: no module Python cannot compile, nor one that
    # reads a name before binding it, ever reaches the disk. The laid-out module is compiled; when the formatter refuses the rendered
    # text, Python says where it is broken.
    name = Path(source).stem + ".py"
    text = render_body(map_view(schema, source=source))
    try:
        body = format_module(text, name)
    except FormatError:
        compiled(text, name)
        raise
    digest = schema_hash if schema_hash is not None else files.schema_hash(schema)
    module = files.compose(body, source=source, command=command, schema_hash=digest)
    compiled(module, name)
    names_bound(module, name)
    return module
