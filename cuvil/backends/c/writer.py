"""A small writer for generated C: lines, indented blocks, safe names and literals.

Model names never become C code: identifiers come from :class:`Names`, and
a model's strings reach the source only through :func:`c_string` (a C string
literal with every unusual byte escaped) or :func:`c_comment` (comment text
that cannot close the comment or start a preprocessor line).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator

_IDENT_SAFE = re.compile(r"[^A-Za-z0-9_]")


class Names:
    """Allocates unique C identifiers from hints; the hint is sanitised, never trusted."""

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._counts: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        base = _IDENT_SAFE.sub("_", hint)[:24] or "t"
        if base[0].isdigit():
            base = "_" + base
        n = self._counts.get(base, 0)
        while True:
            name = f"{base}{n}"
            n += 1
            if name not in self._used:
                break
        self._counts[base] = n
        self._used.add(name)
        return name


def c_string(s: str) -> str:
    """A C string literal holding the UTF-8 bytes of ``s``; safe for any input."""
    out = ['"']
    for b in s.encode("utf-8"):
        ch = chr(b)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif 0x20 <= b < 0x7F and ch != "?":  # '?' avoided: no trigraphs
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    out.append('"')
    return "".join(out)


def c_comment(s: str, limit: int = 120) -> str:
    """Text that is safe inside a ``/* ... */`` comment: printable ASCII, no ``*/``."""
    text = s.encode("unicode_escape").decode("ascii")
    text = "".join(ch if 0x20 <= ord(ch) < 0x7F else "?" for ch in text)
    text = text.replace("*/", "* /").replace("/*", "/ *")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def c_float(x: float, suffix: str = "f") -> str:
    """A C literal for a float (f32 by default); infinities and NaN through macros."""
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    r = repr(float(x))
    if "e" not in r and "." not in r:
        r += ".0"
    return f"{r}{suffix}" if suffix else r


def c_int(x: int) -> str:
    """A C literal for an int64 value (INT64_MIN spelled so it parses)."""
    if x == -(2**63):
        return "INT64_MIN"
    return f"INT64_C({x})"


class CWriter:
    """Collects C source lines with indentation, and which IR node each line came from."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.origins: list[str | None] = []
        self._indent = 0
        self.origin: str | None = None

    def line(self, text: str = "") -> None:
        self.lines.append(("    " * self._indent + text) if text else "")
        self.origins.append(self.origin)

    def comment(self, text: str) -> None:
        self.line(f"/* {c_comment(text)} */")

    @contextlib.contextmanager
    def block(self, head: str, tail: str = "}") -> Iterator[None]:
        self.line(f"{head} {{" if head else "{")
        self._indent += 1
        try:
            yield
        finally:
            self._indent -= 1
            self.line(tail)

    @contextlib.contextmanager
    def indented(self) -> Iterator[None]:
        self._indent += 1
        try:
            yield
        finally:
            self._indent -= 1

    @contextlib.contextmanager
    def capture(self, indent: int = 1) -> Iterator[list[str]]:
        """Lines written inside the block go to the yielded list (indented ``indent`` levels), not
        to this writer: the body of a function defined elsewhere (``KernelCtx.define``)."""
        start, saved = len(self.lines), self._indent
        self._indent = indent
        taken: list[str] = []
        try:
            yield taken
        finally:
            taken.extend(self.lines[start:])
            del self.lines[start:]
            del self.origins[start:]
            self._indent = saved

    @contextlib.contextmanager
    def node(self, origin: str) -> Iterator[None]:
        saved, self.origin = self.origin, origin
        try:
            yield
        finally:
            self.origin = saved

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
