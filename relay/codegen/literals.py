"""Literals: how a text, a dtype or a tuple of names is spelled in Python source.

Pure functions of their argument, below naming in the generator's pipeline: naming
spells the schema's identifiers with them, and the views spell the text they compose
(doc lines, messages) with them; none of them knows a schema.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence

import torch

__all__ = [
    "clean_doc",
    "doc_problem",
    "doc_text",
    "dtype",
    "escape_doc",
    "join",
    "plus",
    "shape_literal",
    "string_literal",
]


def join(opener: str, args: Sequence[str], closer: str = ")") -> str:
    """``opener`` + the arguments + ``closer`` on one line: the formatter lays it out."""
    return opener + ", ".join(args) + closer


def plus(value: str, n: int) -> str:
    """``value + n`` as a line spells it (``value`` alone for 0)."""
    return value if n == 0 else f"{value} + {n}" if n > 0 else f"{value} - {-n}"


def dtype(value: torch.dtype) -> str:
    """``torch.int64`` spelled as source."""
    return str(value)


# Note [Gate constants]
# A gate tests each value's type and dtype on every write, and a resolve its slots'
# dtype: spelled ``torch.int64`` that is two lookups (the module, then its attribute),
# a module-level name one. So a generated module binds the few it tests
# (``_TENSOR = torch.Tensor``, ``_INT64 = torch.int64``) under its imports.

#: The name a generated module binds ``torch.Tensor`` to (Note [Gate constants]).
TENSOR = "_TENSOR"


#: The dtypes a gate may test: every one a field may declare.
GATE_DTYPES = tuple(
    dict.fromkeys(d for d in vars(torch).values() if isinstance(d, torch.dtype))
)


def gate_dtype(value: torch.dtype) -> str:
    """The module-level name a gate tests ``value`` by: ``_INT64``."""
    return "_" + str(value).removeprefix("torch.").upper()


def gate_constants(lines: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The constants ``lines`` read, each with its value as source, in a fixed order."""
    words = set(re.findall(r"\b_[A-Z][A-Z0-9]*\b", "\n".join(lines)))
    known = {TENSOR: "torch.Tensor", **{gate_dtype(d): dtype(d) for d in GATE_DTYPES}}
    return tuple((name, known[name]) for name in sorted(words & known.keys()))


#: The casts torch spells as a method of their own: ``x.int()`` is ``x.to(torch.int32)``
#: (the same op) with less argument parsing per call.
_CAST_METHODS = {
    torch.int32: "int", torch.int64: "long", torch.int16: "short", torch.int8: "char",
    torch.uint8: "byte", torch.bool: "bool", torch.float16: "half",
    torch.bfloat16: "bfloat16", torch.float32: "float", torch.float64: "double",
}  # fmt: skip


def cast_to(value: torch.dtype) -> str:
    """A cast to ``value`` spelled as source: ``.int()``, else ``.to(torch.<dtype>)``."""
    method = _CAST_METHODS.get(value)
    return f".{method}()" if method else f".to({dtype(value)})"


def shape_literal(dims: tuple[str, ...]) -> str:
    """A tuple literal from spelled dims: ``("pool_size", "topk")`` -> ``(pool_size, topk)``."""
    if len(dims) == 1:
        return f"({dims[0]},)"
    return "(" + ", ".join(dims) + ")"


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
