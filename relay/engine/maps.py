"""Which generated maps a run uses: the packaged ``relay.maps``, or modules generated elsewhere.

Note [One set of map classes per run]
The engine takes every generated class it uses (the maps and their payloads) from
one ``Maps`` value, loaded when a run starts; no engine module binds a map class at
import time. A process that generates the maps and then runs them (``relay demo``)
therefore never mixes a fresh map class with a payload class of an older version
of the same module. Modules generated outside ``relay.maps`` are imported from their
files under a private name that includes a hash of their bytes: the same bytes give
the same classes, and edited bytes give new classes, never a reload of old ones.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs

from relay.errors import RelayError

if TYPE_CHECKING:
    from relay.maps.decode import DecodeFutureMap, DecodePayload
    from relay.maps.decode_seq_lens import DecodeSeqLensFutureMap, DecodeSeqLensPayload
    from relay.maps.eagle import EagleFutureMap, EaglePayload
    from relay.maps.ngram import NgramFutureMap, NgramPayload

__all__ = ["MAP_MODULES", "MapSource", "Maps"]

#: The schema modules whose maps the engine runs, by module stem.
MAP_MODULES = ("decode", "decode_seq_lens", "eagle", "ngram")


@attrs.frozen
class Maps:
    """The generated classes of one run (Note [One set of map classes per run])."""

    decode: type[DecodeFutureMap]
    decode_payload: type[DecodePayload]
    decode_seq_lens: type[DecodeSeqLensFutureMap]
    decode_seq_lens_payload: type[DecodeSeqLensPayload]
    eagle: type[EagleFutureMap]
    eagle_payload: type[EaglePayload]
    ngram: type[NgramFutureMap]
    ngram_payload: type[NgramPayload]
    #: The files the classes were loaded from, for messages.
    files: tuple[str, ...]


@attrs.frozen
class MapSource:
    """Where a run's maps come from: ``folder=None`` is the packaged ``relay.maps``,
    else a folder holding the modules of ``MAP_MODULES`` generated from the bundled
    schemas. Plain data, so data-parallel ranks (spawned processes) load the same files.
    """

    folder: str | None = None

    def load(self) -> Maps:
        """Import the modules of ``MAP_MODULES`` (once per content) and take their classes."""
        modules = [self._module(stem) for stem in MAP_MODULES]
        classes = {}
        for stem, module in zip(MAP_MODULES, modules):
            prefix = stem.title().replace("_", "")  # decode_seq_lens: DecodeSeqLens
            classes[stem] = _class(module, f"{prefix}FutureMap")
            classes[f"{stem}_payload"] = _class(module, f"{prefix}Payload")
        return Maps(**classes, files=tuple(str(m.__file__) for m in modules))

    def _module(self, stem: str) -> ModuleType:
        if self.folder is None:
            return importlib.import_module(f"relay.maps.{stem}")
        return import_generated(Path(self.folder, f"{stem}.py"))


def import_generated(path: Path) -> ModuleType:
    """The generated module at ``path``, imported under a name unique to its bytes."""
    try:
        content = path.read_bytes()
    except OSError as error:
        raise RelayError(
            f"{path}: cannot read the generated map ({error.strerror})"
        ) from error
    name = f"_relay_generated_{path.stem}_{hashlib.sha256(content).hexdigest()[:16]}"
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # attrs and typing look classes' modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise RelayError(
            f"{path}: importing the generated map failed: {type(error).__name__}: {error}"
        ) from error
    return module


def _class(module: ModuleType, name: str) -> Any:
    found = getattr(module, name, None)
    if not isinstance(found, type):
        raise RelayError(
            f"{module.__file__}: defines no class {name}; the engine runs maps generated "
            f"from the bundled schemas (schemas/{Path(str(module.__file__)).name})"
        )
    return found
