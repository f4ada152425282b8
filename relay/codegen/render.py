"""Rendering: one validated schema -> the body of its generated module (``files`` adds the header)."""

from __future__ import annotations

from pathlib import Path

import jinja2

from relay.codegen import files
from relay.codegen.formatting import format_module
from relay.codegen.views import MapView, map_view
from relay.schema import Schema

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
    body = format_module(
        render_body(map_view(schema, source=source)), Path(source).stem + ".py"
    )
    digest = schema_hash if schema_hash is not None else files.schema_hash(schema)
    return files.compose(body, source=source, command=command, schema_hash=digest)
