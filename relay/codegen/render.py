"""Rendering: one validated schema -> the bytes of its generated module."""

from __future__ import annotations

import enum
import hashlib
import json
from pathlib import Path

import jinja2

from relay.codegen.views import MapView, map_view
from relay.schema import FromPayload, Schema

_TEMPLATES = Path(__file__).parent / "templates"

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


def _canonical(value: object) -> object:
    """A JSON-ready form of schema values: enums by value, dtypes by name."""
    if isinstance(value, FromPayload):
        return "FROM_PAYLOAD"
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    return str(value)  # torch.dtype


def schema_hash(schema: Schema) -> str:
    """sha256 of the canonical schema: what it declares, not where or how it is spelled."""
    fields = [
        {name: _canonical(getattr(f, name)) for name in sorted(
            a.name for a in f.__attrs_attrs__ if a.name != "declared_at"
        )}
        for f in schema.fields
    ]
    canonical = {"name": schema.name, "doc": schema.doc, "indices": schema.indices,
                 "fields": fields}
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def body_hash(body: str) -> str:
    """sha256 of a module's text below its header: what ``--check`` uses to tell a
    hand-edited file from one an older generator wrote."""
    return "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()


def split_header(text: str) -> tuple[str, str]:
    """``(header, body)``: the leading ``#`` comment lines, and the rest."""
    lines = text.splitlines(keepends=True)
    count = 0
    while count < len(lines) and lines[count].startswith("#"):
        count += 1
    return "".join(lines[:count]), "".join(lines[count:])


def render_view(view: MapView) -> str:
    """The module text of ``view``: LF line ends and exactly one trailing newline.

    The header's last line is the hash of the body, known only once it is rendered.
    """
    text = _ENV.get_template("map.py.jinja").render(m=view).rstrip("\n") + "\n"
    header, body = split_header(text)
    return f"{header}# body-hash: {body_hash(body)}\n{body}"


def render(schema: Schema, *, source: str, command: str) -> str:
    """The generated module of a validated ``schema``."""
    view = map_view(schema, source=source, command=command, schema_hash=schema_hash(schema))
    return render_view(view)
