"""JSON text streamed in fragments (tool-call arguments), read as what its strings say.

Where it sits: a tool call's arguments arrive as deltas of JSON text (`{"to": "jane\\u0040…`);
the client parses them, so a value written with JSON escapes (`\\u0034\\u0031…`, `\\/`, `\\"`) is
the value. The output gate (ext_proc.restore.output_gate) reads such a channel through a
`JsonTextReader`: each escape is undone as the fragments arrive, one that is cut by a fragment's
end waits for the next, and the structure (braces, quotes, keys) stays as it is, so key context
(`"password": …`) still reads. A backslash written as `\\\\` becomes one backslash: the catalog's
decoded views then read what follows it, as they would in the parsed string.
"""

from __future__ import annotations

_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


class JsonTextReader:
    """Undoes JSON string escapes in a text that arrives in fragments (`feed`), holding back an
    escape cut by a fragment's end (`\\u00`, or a high surrogate waiting for its low half)."""

    __slots__ = ("_carry",)

    def __init__(self) -> None:
        self._carry = ""

    @property
    def carry(self) -> str:
        return self._carry

    def load(self, carry: str) -> None:
        self._carry = carry

    def feed(self, fragment: str) -> str:
        text = self._carry + fragment if self._carry else fragment
        if "\\" not in text:
            self._carry = ""
            return text
        out, self._carry = unescape(text, final=False)
        return out

    def finish(self) -> str:
        """The end of the text: an escape still open is kept as written."""
        carry, self._carry = self._carry, ""
        return carry


def unescape(text: str, *, final: bool = True) -> tuple[str, str]:
    """`text` with its JSON escapes undone, and (unless `final`) the open escape at its end that
    was left out; an escape JSON does not define is kept as written."""
    out: list[str] = []
    i = 0
    n = len(text)
    while True:
        j = text.find("\\", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out), ""
        out.append(text[i:j])
        if j + 1 >= n:
            return _open(out, text, j, final)
        kind = text[j + 1]
        if kind != "u":
            out.append(_SIMPLE.get(kind, text[j : j + 2]))
            i = j + 2
            continue
        digits = text[j + 2 : j + 6]
        if not all(ch in _HEX for ch in digits):
            out.append(text[j : j + 2])  # not an escape JSON knows: kept as written
            i = j + 2
            continue
        if len(digits) < 4:
            return _open(out, text, j, final)
        code = int(digits, 16)
        if 0xD800 <= code < 0xDC00:
            low = text[j + 6 : j + 12]
            if len(low) < 6 and "\\u".startswith(low[:2]) and all(ch in _HEX for ch in low[2:]):
                if not final:
                    return "".join(out), text[j:]  # the low half may follow
            elif (
                low[:2] == "\\u" and all(ch in _HEX for ch in low[2:]) and 0xDC00 <= int(low[2:], 16) < 0xE000
            ):
                pair = 0x10000 + ((code - 0xD800) << 10) + (int(low[2:], 16) - 0xDC00)
                out.append(chr(pair))
                i = j + 12
                continue
        out.append(chr(code))
        i = j + 6


def _open(out: list[str], text: str, at: int, final: bool) -> tuple[str, str]:
    if final:
        out.append(text[at:])
        return "".join(out), ""
    return "".join(out), text[at:]
