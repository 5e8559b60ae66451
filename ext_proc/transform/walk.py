"""The fail-closed leaf walk: every string of a JSON body passes through one function.

Whatever the dialect, every string value and every object key is handed to `visit`, including
item types no dialect module knows about. The only strings that are not are:
- structural values (`type`, `role`, `id`, `model`, tool `name`, …) outside caller data, because
  they are protocol, not content, and rewriting them breaks the request;
- media payload bytes at their schema positions (ext_proc.media.parts), judged by the media policy;
- system text, when the tenant's policy says `redactSystem: false`.
Under caller-defined data (`metadata`, prompt `variables`, tool `arguments`/`input`, tool
parameter schemas) nothing is exempt. JSON carried inside a string is parsed and walked as JSON,
one level deeper, so its keys and escaped characters are read as the upstream would read them.

Nesting beyond `MAX_DEPTH` (JSON inside strings included) is refused, never half-read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ext_proc.errors import CordonError

MAX_DEPTH = 64

STRUCTURAL_KEYS = frozenset(
    {
        "type",
        "role",
        "status",
        "id",
        "call_id",
        "tool_call_id",
        "tool_use_id",
        "item_id",
        "approval_request_id",
        "previous_response_id",
        "model",
        "encrypted_content",
        "signature",
        "file_id",
        "object",
        "finish_reason",
        "stop_reason",
    }
)
# Keys whose subtree is the caller's own data: nothing below them is structural.
CALLER_KEYS = frozenset(
    {"metadata", "variables", "arguments", "input", "parameters", "input_schema", "schema", "properties"}
)

# Numbers shorter than this cannot hold a catalog identifier (cards, phones, SSNs are 9+ digits).
MIN_NUMBER_DIGITS = 9


class BodyError(CordonError):
    """The body cannot be read in full as the API's JSON: it is never forwarded half-read."""


class NestingTooDeep(BodyError):
    def __init__(self) -> None:
        super().__init__(
            f"the JSON body is nested deeper than {MAX_DEPTH} levels (counting JSON inside strings); "
            "it was not forwarded"
        )


class NotJson(BodyError):
    def __init__(self, reason: str) -> None:
        super().__init__(f"the request body is not valid JSON: {reason}")
        self.reason = reason


class AmbiguousJson(NotJson):
    """JSON that parsers read differently (a key twice, NaN, a number no float can hold).

    Refused wherever it is, also inside a string: reading it one way while the upstream (or a tool)
    reads it another is how a value would slip past the walk.
    """


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        # Which value would the upstream take? Parsers disagree; refuse rather than guess.
        raise AmbiguousJson("an object has the same key twice")
    return out


def _no_constants(name: str) -> Any:
    raise AmbiguousJson(f"{name} is not JSON")


def _finite(literal: str) -> float:
    number = float(literal)
    if math.isinf(number):
        raise AmbiguousJson("a number is too large to represent")
    return number


def parse_json(text: str) -> Any:
    """Parse strictly: duplicate keys, NaN/Infinity and overflowing numbers are refused."""
    try:
        return json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite
        )
    except RecursionError:
        raise NestingTooDeep() from None
    except json.JSONDecodeError as exc:
        raise NotJson(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError:
        # int() refuses a literal past sys.get_int_max_str_digits() (4,300 digits): not a
        # JSONDecodeError, and it must be a refusal here, not an error that ends the exchange.
        raise AmbiguousJson("a number has too many digits to read") from None


def looks_like_json(text: str) -> bool:
    """A string that may carry a JSON object or array (tool arguments): worth parsing as JSON."""
    stripped = text.strip()
    return len(stripped) >= 2 and stripped[0] in "{[" and stripped[-1] in "}]"


def dump_json(doc: Any) -> bytes:
    try:
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        # JSON lets `\ud800` through; no UTF-8 (and no two parsers alike) can carry it.
        raise NotJson("a \\u escape encodes half a character (a lone surrogate)") from None


@dataclass(slots=True)
class WalkStats:
    strings: int = 0  # strings handed to visit (keys included)
    skipped_media: int = 0
    skipped_system: int = 0
    skipped_structural: int = 0
    changed: bool = False
    skips: list[str] = field(default_factory=list)


Visit = Callable[[str], str]


class LeafWalker:
    """Walks one document; `visit` returns the string to forward in place of the one it read."""

    def __init__(
        self,
        visit: Visit,
        *,
        media_positions: set[tuple[int, object]],
        system_positions: set[tuple[int, object]],
    ) -> None:
        self._visit = visit
        self._media = media_positions
        self._system = system_positions
        self.stats = WalkStats()

    def walk(self, doc: Any) -> Any:
        return self._value(doc, 0, caller=False, key=None, parent=None)

    def _text(self, text: str) -> str:
        self.stats.strings += 1
        out = self._visit(text)
        if out is not text and out != text:
            self.stats.changed = True
        return out

    def _string(self, text: str, depth: int, caller: bool) -> str:
        if looks_like_json(text):
            try:
                inner = parse_json(text)
            except AmbiguousJson as exc:
                raise AmbiguousJson(f"JSON inside a string: {exc.reason}") from None
            except NotJson:
                inner = None
            if isinstance(inner, (dict, list)):
                before = self.stats.changed
                self.stats.changed = False
                walked = self._value(inner, depth + 1, caller=True, key=None, parent=None)
                inner_changed = self.stats.changed
                self.stats.changed = before or inner_changed
                return dump_json(walked).decode("utf-8") if inner_changed else text
        return self._text(text)

    def _number(self, number: int | float) -> Any:
        if isinstance(number, bool):
            return number
        if isinstance(number, float):
            if not number.is_integer():
                return number
            number = int(number)
        digits = str(abs(number))
        if len(digits) < MIN_NUMBER_DIGITS:
            return number
        out = self._text(str(number))
        return number if out == str(number) else out

    def _value(self, value: Any, depth: int, *, caller: bool, key: object, parent: Any) -> Any:
        if isinstance(value, str):
            return self._string(value, depth, caller)
        if isinstance(value, dict):
            if depth >= MAX_DEPTH:
                raise NestingTooDeep()
            return self._dict(value, depth + 1, caller)
        if isinstance(value, list):
            if depth >= MAX_DEPTH:
                raise NestingTooDeep()
            ident = id(value)
            out_list = []
            for index, item in enumerate(value):
                if (ident, index) in self._system:
                    self.stats.skipped_system += 1
                    out_list.append(item)
                    continue
                out_list.append(self._value(item, depth + 1, caller=caller, key=index, parent=value))
            return out_list
        if isinstance(value, (int, float)):
            return self._number(value)
        return value

    def _dict(self, obj: dict[str, Any], depth: int, caller: bool) -> dict[str, Any]:
        ident = id(obj)
        is_message = "role" in obj
        out: dict[str, Any] = {}
        for key, item in obj.items():
            position = (ident, key)
            if position in self._media:
                self.stats.skipped_media += 1
                out[key] = item
                continue
            if position in self._system:
                self.stats.skipped_system += 1
                out[key] = item
                continue
            if (
                not caller
                and isinstance(item, str)
                and (key in STRUCTURAL_KEYS or (key == "name" and not is_message))
            ):
                self.stats.skipped_structural += 1
                out[key] = item
                continue
            # Keys are text too: a caller's metadata key can be an email address.
            new_key = self._text(key)
            child_caller = caller or (key in CALLER_KEYS and (key != "input" or isinstance(item, dict)))
            out[new_key] = self._value(item, depth, caller=child_caller, key=key, parent=obj)
        return out
