"""Upstream text as a reader of it would see it, for router/upstream/scrub.py to find keys in:
every escape of one character decoded, in as many layers as the text was escaped in (Go's
JSON writes an HTML reference's `&` as `\\u0026`), and for each decoded byte the raw bytes
it came from, so that a key found in the decoded text is taken out of the raw one.

The escapes a reader decodes, in any mix:
- JSON's `\\uXXXX` (any encoder may write any character so; .NET writes `+` as `\\u002B`)
  and `\\/`, `\\"`, `\\\\`;
- HTML's character references: decimal and hexadecimal, with or without their `;` and with
  any leading zeros (`&#115;`, `&#x73`, `&#0000115;`), and every named one that stands
  for an ASCII character, HTML5's included (`&amp;`, `&sol;`, `&plus;`, `&equals;`);
- URL quoting, in either case (`%2D`, `%2d`).
Escapes are few in ordinary text: the map holds one entry per escape, not per byte.
"""

from __future__ import annotations

import bisect
import html.entities
import re
import string

# HTML's named references that stand for one ASCII character, as names with no `;`.
_NAMED = {
    name.rstrip(";").encode(): value.encode()
    for name, value in html.entities.html5.items()
    if len(value) == 1 and ord(value) < 128
}
_NAMES = b"|".join(re.escape(n) for n in sorted(_NAMED, key=len, reverse=True))
_ESCAPE = re.compile(
    rb"\\u([0-9a-fA-F]{4})"  # 1: JSON \uXXXX
    rb'|\\(["\\/])'  # 2: JSON \" \\ \/
    rb"|&#0*([0-9]{1,7});?"  # 3: HTML decimal
    rb"|&#[xX]0*([0-9a-fA-F]{1,6});?"  # 4: HTML hexadecimal
    rb"|&(" + _NAMES + rb");?"  # 5: HTML named
    rb"|%([0-9a-fA-F]{2})"  # 6: URL quoting
)
# An escape a chunk's end may have cut, which the next chunk may complete.
OPEN_ESCAPE = re.compile(rb"(?:\\(?:u[0-9a-fA-F]{0,3})?|&(?:#[xX]?[0-9a-fA-F]*|[A-Za-z]*)|%[0-9a-fA-F]?)$")
# The bytes an escape is written with: a chunk ending in one may end in an escape.
ESCAPE_BYTES = (string.ascii_letters + string.digits + "\\%&#;").encode()
_LAYERS = 3  # escapes of escapes of escapes: no reader decodes more


class _Layer:
    """`raw` with one layer of escapes decoded, and where each decoded byte came from."""

    def __init__(self, raw: bytes) -> None:
        parts: list[bytes] = []
        self._starts: list[int] = []  # decoded offset where each segment starts
        self._raw_at: list[int] = []  # its raw offset
        self._escape_len: list[int] = []  # 0: a plain run; else the escape's raw length
        at = out = 0
        for m in _ESCAPE.finditer(raw):
            if m.start() > at:
                self._segment(out, at, 0)
                parts.append(raw[at : m.start()])
                out += m.start() - at
            self._segment(out, m.start(), m.end() - m.start())
            parts.append(_decoded(m))
            out += 1
            at = m.end()
        if at < len(raw):
            self._segment(out, at, 0)
            parts.append(raw[at:])
        self.text = b"".join(parts)
        self.changed = len(self._escape_len) > 0 and any(self._escape_len)

    def _segment(self, out: int, raw: int, escape: int) -> None:
        self._starts.append(out)
        self._raw_at.append(raw)
        self._escape_len.append(escape)

    def raw_start(self, i: int) -> int:
        """The raw offset of decoded byte `i`."""
        k = bisect.bisect_right(self._starts, i) - 1
        return self._raw_at[k] + (0 if self._escape_len[k] else i - self._starts[k])

    def raw_end(self, i: int) -> int:
        """The raw offset just past decoded byte `i`."""
        k = bisect.bisect_right(self._starts, i) - 1
        esc = self._escape_len[k]
        return self._raw_at[k] + esc if esc else self._raw_at[k] + i - self._starts[k] + 1


def _decoded(m: re.Match[bytes]) -> bytes:
    """One escape's character; one that is not ASCII is a NUL, as no key holds one."""
    if m.group(2) is not None:
        return m.group(2)
    if m.group(5) is not None:
        return _NAMED[m.group(5)]
    if m.group(6) is not None:
        number = int(m.group(6), 16)
    elif m.group(3) is not None:
        number = int(m.group(3))
    else:
        number = int(m.group(1) or m.group(4), 16)
    return bytes([number]) if number < 128 else b"\x00"


class View:
    """`raw` as its reader sees it (`text`), with the way back to the raw bytes."""

    def __init__(self, raw: bytes) -> None:
        self._layers: list[_Layer] = []
        self._texts = [raw]
        text = raw
        while len(self._layers) < _LAYERS and (b"\\" in text or b"&" in text or b"%" in text):
            layer = _Layer(text)
            if not layer.changed:
                break
            self._layers.append(layer)
            text = layer.text
            self._texts.append(text)
        self.text = text

    def raw_span(self, i: int, end: int) -> tuple[int, int]:
        """The raw bytes that decoded bytes i..end-1 came from."""
        for layer in reversed(self._layers):
            i, end = layer.raw_start(i), layer.raw_end(end - 1)
        return i, end

    def open_escape(self) -> int | None:
        """Where an escape that the text's end cut short starts, in the raw bytes, in any
        layer (Go's JSON writes the `&` of an HTML reference as `\\u0026`, so the reference
        left open is seen one layer up); None when none is."""
        starts = []
        for k, text in enumerate(self._texts):
            if (m := OPEN_ESCAPE.search(text)) is not None:
                i = m.start()
                for layer in reversed(self._layers[:k]):
                    i = layer.raw_start(i)
                starts.append(i)
        return min(starts) if starts else None
