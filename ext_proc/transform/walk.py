"""The fail-closed leaf walk: every string of a JSON body passes through one function.

Whatever the dialect, every string value and every object key is handed to `visit`, including
item types no dialect module knows about; each value with its key path (`KeyPath`), so a reader can
judge it in its key's context. The only strings that are not handed over are:
- structural values (`type`, `role`, `id`, `model`, tool `name`, …) outside caller data, because
  they are protocol, not content, and rewriting them breaks the request;
- real media bytes at their schema positions (ext_proc.media.parts), judged by the media policy
  (a media position's payload that is base64 of text is read as that text);
- system text, when the tenant's policy says `redactSystem: false`.
Under caller-defined data (`metadata`, prompt `variables`, tool `arguments`/`input`, tool
parameter schemas) nothing is exempt. JSON carried inside a string is parsed and walked as JSON,
one level deeper (its key path continuing the string's), so its keys and escaped characters are
read as the upstream would read them. Two keys of one object never merge after redaction: a
collision is renamed by the caller's `distinct_key` or refused (`KeyCollision`).

Nesting beyond `MAX_DEPTH` (JSON inside strings included) is refused, never half-read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ext_proc.detect.structure import PATH_STEPS, KeyPath
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

# Numbers shorter than this cannot hold a catalog identifier (cards, phones, SSNs are 9+ digits),
# unless their key names one (`{"pin": …}` aside, a password or a short phone number).
MIN_NUMBER_DIGITS = 9
MIN_KEYED_DIGITS = 3


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


# A value's key path (ext_proc.detect.structure): object keys from the outside in, list indices
# left out, the last PATH_STEPS of them. A name/value pair (`{"name": "DB_PASSWORD", "value": …}`)
# names its value.
PAIR_NAMES = ("name", "key", "field", "label", "header", "param", "parameter", "variable", "var")
PAIR_VALUES = frozenset({"value", "values"})

# visit(text, path): the string to forward in place of `text`; `path` is the value's key path,
# None for an object key (a key is read as text, never in the context of its parent).
Visit = Callable[[str, KeyPath | None], str]
Position = tuple[int, object]


class Encoded(Protocol):
    """A payload that is base64 of text at a media position (ext_proc.media.parts.Payload)."""

    @property
    def prefix(self) -> str: ...

    def text(self) -> str | None: ...

    def encode(self, text: str, prefix: str) -> str: ...


class KeyCollision(BodyError):
    """Two object keys would be forwarded as one after redaction: one value would be lost."""

    def __init__(self) -> None:
        super().__init__(
            "two keys of one object would be the same after redaction; the request was not forwarded"
        )


def _never(_path: KeyPath) -> bool:
    return False


class LeafWalker:
    """Walks one document; `visit` returns the string to forward in place of the one it read.

    `encoded`: media positions whose payload is base64 of text, read as that text.
    `read_number(path)`: whether a number under `path` is read however short it is (its key may
    name an identifier). `distinct_key(key, n)`: another form of a redacted key that collides with
    one already written (strip markers numbered), or None; without it a collision is refused.
    """

    def __init__(
        self,
        visit: Visit,
        *,
        media_positions: set[Position],
        system_positions: set[Position],
        encoded: Mapping[Position, Encoded] | None = None,
        read_number: Callable[[KeyPath], bool] = _never,
        distinct_key: Callable[[str, int], str | None] | None = None,
    ) -> None:
        self._visit = visit
        self._media = media_positions
        self._system = system_positions
        self._encoded = encoded or {}
        self._read_number = read_number
        self._distinct_key = distinct_key
        self.stats = WalkStats()

    def walk(self, doc: Any) -> Any:
        return self._value(doc, 0, caller=False, path=())

    def _text(self, text: str, path: KeyPath | None) -> str:
        self.stats.strings += 1
        out = self._visit(text, path)
        if out is not text and out != text:
            self.stats.changed = True
        return out

    def _string(self, text: str, depth: int, path: KeyPath) -> str:
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
                walked = self._value(inner, depth + 1, caller=True, path=path)
                inner_changed = self.stats.changed
                self.stats.changed = before or inner_changed
                return dump_json(walked).decode("utf-8") if inner_changed else text
        return self._text(text, path)

    def _payload(self, item: Any, encoded: Encoded, depth: int, caller: bool, path: KeyPath) -> Any:
        """A media position whose payload is base64 of text: that text is what it says, so it is
        read (and written back encoded the same way), with the data: URL's head before it. The
        base64 characters themselves spell nothing."""
        decoded = encoded.text()
        if decoded is None:
            return self._value(item, depth, caller=caller, path=path)
        before = self.stats.changed
        self.stats.changed = False
        prefix = self._text(encoded.prefix, path) if encoded.prefix else ""
        new = self._string(decoded, depth, path)
        changed = self.stats.changed
        self.stats.changed = before or changed
        return encoded.encode(new, prefix) if changed else item

    def _number(self, number: int | float, path: KeyPath) -> Any:
        if isinstance(number, bool):
            return number
        if isinstance(number, float):
            if not number.is_integer():
                return number
            number = int(number)
        digits = str(abs(number))
        if len(digits) < MIN_NUMBER_DIGITS and not (
            len(digits) >= MIN_KEYED_DIGITS and self._read_number(path)
        ):
            return number
        out = self._text(str(number), path)
        return number if out == str(number) else out

    def _member(
        self, position: Position, item: Any, depth: int, caller: bool, path: KeyPath
    ) -> tuple[bool, Any]:
        """A dict member or list item at a media or system position: (handled, what to forward)."""
        if position in self._media:
            self.stats.skipped_media += 1
            return True, item
        if position in self._system:
            self.stats.skipped_system += 1
            return True, item
        encoded = self._encoded.get(position)
        if encoded is not None:
            return True, self._payload(item, encoded, depth, caller, path)
        return False, None

    def _value(self, value: Any, depth: int, *, caller: bool, path: KeyPath) -> Any:
        if isinstance(value, str):
            return self._string(value, depth, path)
        if isinstance(value, dict):
            if depth >= MAX_DEPTH:
                raise NestingTooDeep()
            return self._dict(value, depth + 1, caller, path)
        if isinstance(value, list):
            if depth >= MAX_DEPTH:
                raise NestingTooDeep()
            ident = id(value)
            out_list = []
            for index, item in enumerate(value):
                handled, out = self._member((ident, index), item, depth + 1, caller, path)
                if not handled:
                    out = self._value(item, depth + 1, caller=caller, path=path)
                out_list.append(out)
            return out_list
        if isinstance(value, (int, float)):
            return self._number(value, path)
        return value

    def _dict(self, obj: dict[str, Any], depth: int, caller: bool, path: KeyPath) -> dict[str, Any]:
        ident = id(obj)
        is_message = "role" in obj
        pair_name = _pair_name(obj)
        out: dict[str, Any] = {}
        for key, item in obj.items():
            step = pair_name if pair_name is not None and key in PAIR_VALUES else key
            child_path = (*path[1 - PATH_STEPS :], step) if path else (step,)
            handled, value = self._member((ident, key), item, depth, caller, child_path)
            if not handled and (
                not caller
                and isinstance(item, str)
                and (key in STRUCTURAL_KEYS or (key == "name" and not is_message))
            ):
                self.stats.skipped_structural += 1
                handled, value = True, item
            if handled:
                if key in out:
                    raise KeyCollision()  # a redacted key became this one, which keeps its name
                out[key] = value
                continue
            # Keys are text too: a caller's metadata key can be an email address.
            new_key = self._text(key, None)
            if new_key in out:
                new_key = self._distinct(new_key, out, len(obj))
            child_caller = caller or (key in CALLER_KEYS and (key != "input" or isinstance(item, dict)))
            out[new_key] = self._value(item, depth, caller=child_caller, path=child_path)
        return out

    def _distinct(self, key: str, out: dict[str, Any], size: int) -> str:
        """A form of a redacted key no other key of the object has yet, or KeyCollision."""
        if self._distinct_key is not None:
            for n in range(2, size + 2):
                candidate = self._distinct_key(key, n)
                if candidate is None:
                    break
                if candidate not in out:
                    self.stats.changed = True
                    return candidate
        raise KeyCollision()


def _pair_name(obj: dict[str, Any]) -> str | None:
    """The name a name/value pair gives its value (`{"name": "DB_PASSWORD", "value": …}`)."""
    if not any(key in obj for key in PAIR_VALUES):
        return None
    for key in PAIR_NAMES:
        name = obj.get(key)
        if isinstance(name, str) and 0 < len(name) <= 64:
            return name
    return None
