"""Naming: every identifier and literal the generated code spells, in one place.

Schema name -> class names, field -> buffer, attribute and local names, dtypes ->
source spellings, row shapes -> tuple literals, strings -> source literals. Views
and the template ask here; nothing else invents a name.

``RESERVED`` lists every fixed name a generated module binds or calls (imports,
method names and parameters, attributes, locals); ``bound_names`` adds the ones
minted from a schema. ``identifier_problem`` says why a schema name cannot be used
as Python sees it (after NFKC normalization).
"""

from __future__ import annotations

import inspect
import keyword
import re
import unicodedata

import torch

from relay.schema import Dim, Field, Lane, Schema, resolve_method

#: Every fixed name a generated module binds or uses: module imports and aliases,
#: method names and parameters, ``self`` attributes and locals. A field, source, dim or schema name equal to one of these (as Python sees
#: it, after NFKC) would shadow or clash with generated code. A test keeps this list
#: equal to what the template emits.
RESERVED = frozenset(
    {
        # module level
        "annotations",
        "Protocol",
        "attrs",
        "torch",
        "_rt",
        "_TABLE",
        "__all__",
        # methods
        "__init__",
        "stash",
        "publish",
        "invalidate",
        "release",
        "resolve_future",
        "seed",
        "graph_wrote",
        "stash_partial",
        "resolve_tails",
        # parameters and locals
        "self",
        "device",
        "pool_size",
        "debug",
        "indices",
        "payload",
        "batch",
        "index_shape",
        "owners",
        "host",
        "host_copy",
        "tail_lengths",
        "tail_locations",
        "tail_host",
        "tail_prefix",
        "state",
        "stream_ordered",
        # attributes of the map
        "_state",
        "fused_gather",
    }
)

#: Methods every generated map may define besides the schedule resolves.
METHODS = frozenset(
    {
        "stash",
        "publish",
        "invalidate",
        "release",
        "resolve_future",
        "seed",
        "graph_wrote",
        "stash_partial",
        "resolve_tails",
    }
)

_MAP_SUFFIX = "FutureMap"


def python_name(name: str) -> str:
    """``name`` as the Python parser sees it: identifiers are NFKC-normalized."""
    return unicodedata.normalize("NFKC", name)


def is_identifier(name: object) -> bool:
    """A Python identifier that is not a keyword (after NFKC, as Python reads it)."""
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not keyword.iskeyword(python_name(name))
    )


def identifier_problem(name: object, *, reserved: bool = True) -> str | None:
    """Why ``name`` cannot name a field, source, dim or path part; ``None`` if it can.

    Python normalizes identifiers with NFKC, so ``ﬁeld`` and ``field`` are one
    name: the checks (keyword, mangling, dunder, reserved) look at that form, and a
    name whose normalized form differs is refused outright so the schema, the
    generated code and the error messages all spell it the same way. With
    ``reserved=False`` (attribute names on the batch) ``RESERVED`` is not checked.
    """
    if not isinstance(name, str) or not name.isidentifier():
        return "is not a Python identifier"
    seen = python_name(name)
    if seen != name:
        return f"is read by Python as {seen!r} (NFKC normalization); spell it that way"
    if keyword.iskeyword(seen) or keyword.issoftkeyword(seen):
        return "is a Python keyword"
    if seen.startswith("__") and seen.endswith("__"):
        return "is a dunder name, reserved for Python"
    if seen.startswith("__"):
        return "starts with '__', which Python mangles inside the generated classes"
    if reserved and seen in RESERVED:
        return "is a name the generated module binds itself"
    return None


def prefix(schema: Schema) -> str:
    """``EagleFutureMap`` -> ``Eagle``: the stem of the payload and protocol names."""
    name = schema.name
    if name.endswith(_MAP_SUFFIX) and len(name) > len(_MAP_SUFFIX):
        return name[: -len(_MAP_SUFFIX)]
    return name


def payload_class(schema: Schema) -> str:
    return f"{prefix(schema)}Payload"


def batch_protocol(schema: Schema) -> str:
    return f"{prefix(schema)}Batch"


def schedule_protocol(schema: Schema) -> str:
    """The schedule lane's batch Protocol, where the schema names that lane's slots or
    owners (Note [Slots per lane] in relay/schema.py)."""
    return f"{prefix(schema)}ScheduleBatch"


def _camel(part: str) -> str:
    return "".join(word[:1].upper() + word[1:] for word in part.split("_"))


def nested_protocol(
    schema: Schema, path: tuple[str, ...], *, schedule: bool = False
) -> str:
    """``("spec_info",)`` -> ``EagleSpecInfo``: the protocol of ``batch.spec_info``
    (``EagleScheduleSpecInfo`` on the schedule lane's batch, ``schedule=True``).

    The stem is not repeated when the path starts with it (``SpecFutureMap`` and
    ``spec_info`` give ``SpecInfo``, not ``SpecSpecInfo``).
    """
    camel = "".join(_camel(part) for part in path)
    stem = prefix(schema)
    if schedule:
        camel = f"Schedule{camel}"
    if camel.startswith(stem) and camel != stem:
        return camel
    return f"{stem}{camel}"


def buffer(field: Field) -> str:
    return f"{field.name}_buf"


def _dtype_stem(value: torch.dtype) -> str:
    return str(value).removeprefix("torch.")


def packed_buffer(value: torch.dtype) -> str:
    """The private buffer a packed layout shares among the fields of dtype ``value``."""
    return f"_{_dtype_stem(value)}_packed"


def packed_widths(value: torch.dtype) -> str:
    """The private tuple of a packed buffer's column counts, field by field."""
    return f"_{_dtype_stem(value)}_widths"


def packed_rows(value: torch.dtype) -> str:
    """The local holding a packed buffer's gathered rows in ``resolve_future``."""
    return f"_{_dtype_stem(value)}_rows"


def host_mirror(field: Field) -> str:
    """The private ``HostMirror`` attribute of a schedule field."""
    return f"_{field.name}_host"


def value_local(field: Field) -> str:
    """The local holding a schedule field's gathered rows (fields never shadow locals:
    ``indices``, ``slots``, ``batch`` and ``self`` are reserved)."""
    return field.name


def placeholder_locals(field: Field) -> tuple[str, str, str]:
    """Locals of a placeholder resolve: the target, its pending mask, the rows read."""
    return f"{field.name}_at", f"{field.name}_pending", f"{field.name}_rows"


def _path_names(schema: Schema, path: str) -> set[str]:
    parts = tuple(path.split("."))
    names = set(parts)
    for schedule in (False, True) if schema.lanes_apart else (False,):
        names.update(
            nested_protocol(schema, parts[:depth], schedule=schedule)
            for depth in range(1, len(parts))
        )
    return names


def field_paths(f: Field) -> list[str]:
    """Every batch attribute path field ``f`` names, in declaration order."""
    paths: list[object] = [f.target, f.gate]
    if f.scatter is not None:
        paths += [f.scatter.offsets, f.scatter.lengths, f.scatter.when]
    if f.host is not None:
        paths += [f.host.mirror, f.host.sum]
    if f.tails is not None:
        kv = f.tails.kv
        paths += [
            f.tails.rows,
            *((kv.locations, kv.table) if kv else ()),
            f.tails.prefix,
        ]
    return [p for p in paths if isinstance(p, str)]


def bound_names(schema: Schema) -> frozenset[str]:
    """Every name a module generated from ``schema`` binds: ``RESERVED`` plus the
    class, method, attribute, parameter and local names minted from the schema."""
    names = set(RESERVED)
    names.update({schema.name, payload_class(schema), batch_protocol(schema)})
    names.update(_path_names(schema, schema.indices))
    if schema.lanes_apart:  # Note [Slots per lane] in relay/schema.py
        names.add(schedule_protocol(schema))
    lanes = schema.schedule
    for owners in (schema.owners, *((lanes.indices, lanes.owners) if lanes else ())):
        if isinstance(owners, str):
            names.update(_path_names(schema, owners))
    for f in schema.fields:
        names.update({buffer(f), host_mirror(f), f.payload_name})
        names.add(value_local(f))
        names.update(placeholder_locals(f))
        # a count's last name is a payload attribute too
        for path in field_paths(f):
            names.update(_path_names(schema, path))
        if f.lane is Lane.SCHEDULE:
            names.add(resolve_method(f))
        names.update(d for d in f.shape if isinstance(d, str))
        if schema.layout.value == "packed" and isinstance(f.dtype, torch.dtype):
            names.update(
                {packed_buffer(f.dtype), packed_widths(f.dtype), packed_rows(f.dtype)}
            )
    return frozenset(names)


def dtype(value: torch.dtype) -> str:
    """``torch.int64`` spelled as source."""
    return str(value)


def shape_literal(dims: tuple[str, ...]) -> str:
    """A tuple literal from spelled dims: ``("pool_size", "topk")`` -> ``(pool_size, topk)``."""
    if len(dims) == 1:
        return f"({dims[0]},)"
    return "(" + ", ".join(dims) + ")"


def eager_shape(field: Field) -> str:
    """The allocation shape of an eager field: the pool dim, then the row dims."""
    return shape_literal(("pool_size", *(str(d) for d in field.shape)))


def symbolic_dims(fields: tuple[Field, ...]) -> list[str]:
    """Symbolic dims of eager fields in first-use order: the constructor keywords."""
    seen: list[str] = []
    for field in fields:
        if field.alloc.value != "eager":
            continue
        for dim in field.shape:
            if isinstance(dim, str) and dim not in seen:
                seen.append(dim)
    return seen


def describe_shape(shape: tuple[Dim, ...]) -> str:
    """Human spelling of a row shape for doc strings: ``(pool_size, topk)``."""
    return shape_literal(("pool_size", *(str(d) for d in shape)))


# Printable ASCII with nothing to escape: most names and doc strings, passed through
# whole (escaping one character at a time dominated generating 1,000-field schemas).
_PLAIN_LITERAL = re.compile(r"[ !#-\[\]-~]*")
_PLAIN_DOC = re.compile(r"[\t\n -\[\]-~]*")
#: The quotes of a doc string's body that must be escaped.
_QUOTES = re.compile(r'\A"|"(?=")|"\Z')


def string_literal(text: str) -> str:
    """A double-quoted literal that reads back as ``text`` exactly (any code point)."""
    if _PLAIN_LITERAL.fullmatch(text):
        return f'"{text}"'
    out = ['"']
    for ch in text:
        out.append(_escape(ch, '"'))
    out.append('"')
    return "".join(out)


def _escape(ch: str, quote: str) -> str:
    if ch == "\\":
        return "\\\\"
    if ch == quote:
        return "\\" + ch
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF or not ch.isprintable():
        if code <= 0xFF:
            return f"\\x{code:02x}"
        if code <= 0xFFFF:
            return f"\\u{code:04x}"
        return f"\\U{code:08x}"
    return ch


def clean_doc(text: str) -> str:
    """``text`` as ``inspect.getdoc`` shows a doc string: ``inspect.cleandoc``, with no
    trailing blanks (a formatter strips them from doc strings)."""
    # cleandoc splits on "\n" only: other line breaks stay inside a line, escaped.
    # Repeated until nothing changes: a line of blanks first is kept by cleandoc, yet
    # reads back as no line at all, and the line after it then loses its indent.
    while True:
        lines = [line.rstrip() for line in inspect.cleandoc(text).split("\n")]
        cleaned = "\n".join(lines).strip("\n")
        if cleaned == text:
            return cleaned
        text = cleaned


def doc_text(text: str) -> str:
    """The body of a ``\"\"\"`` doc string that reads back as ``clean_doc(text)``
    after ``inspect.cleandoc``: backslashes, quotes, control characters and lone
    surrogates escaped, newlines kept."""
    return escape_doc(clean_doc(text))


def doc_problem(text: str) -> str | None:
    """Why ``text`` cannot be a doc string of the generated module; ``None`` if it can.

    Everything is escaped faithfully except lone surrogates: CPython encodes a class doc
    string to UTF-8 when it creates the class, which they cannot survive.
    """
    for index, ch in enumerate(text):
        if 0xD800 <= ord(ch) <= 0xDFFF:
            return (
                f"contains a lone surrogate (U+{ord(ch):04X}) at offset {index}, which "
                "Python cannot put in a class doc string; remove it or pair it"
            )
    return None


def escape_doc(text: str) -> str:
    """``text`` made safe inside ``\"\"\"``, kept as written otherwise."""
    body = text if _PLAIN_DOC.fullmatch(text) else "".join(_doc_char(ch) for ch in text)
    # No two unescaped quotes side by side, so no run of them ends the string early;
    # nor one first (a formatter would pad it with a space) or last (it would merge
    # with the closing quotes). ``body`` holds no escaped quote yet.
    return _QUOTES.sub(r'\\"', body) if '"' in body else body


def _doc_char(ch: str) -> str:
    return ch if ch in '\n\t"' else _escape(ch, '"')
