"""Results of pure text functions, remembered per process under a keyed digest of the text.

An agent resends its whole conversation every turn: the fortieth request of a session carries
the thirty-nine earlier turns' strings again, and the egress check reads the same redacted
strings again. Detection is a pure function of (matcher set, text), so its result for a string
read before can be reused, and only the new strings of a request are scanned.

The memo holds no text: it is keyed by a BLAKE2b digest of the text under a random per-process
key, and holds only what the function returned (kinds and spans, or a label). A call that raises
(a regex timeout, a work bound) is not remembered, so a failure is never turned into a result.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar, cast

_R = TypeVar("_R")

# Short strings (a role, a model name, a finish reason) would crowd the long ones out, so they
# have a memo of their own: every request and reply repeats them, and a lookup (about a
# microsecond) costs far less than a scan (tens). Each memo is bounded by weight: one per entry
# plus one per item of a tuple result (a finding), about 150 bytes each, so a worker holds at
# most about 2.5 MB of both.
MIN_LENGTH = 48
MAX_WEIGHT = 8192
SHORT_MAX_WEIGHT = 2048
_KEY = secrets.token_bytes(32)


class TextMemo:
    """An LRU of `compute(text)` per (scope, digest of text), bounded by weight; thread-safe.
    Texts shorter than `min_length` go to the `short` memo (computed every time without one)."""

    def __init__(
        self, max_weight: int = MAX_WEIGHT, min_length: int = MIN_LENGTH, short: TextMemo | None = None
    ) -> None:
        self.max_weight = max_weight
        self.min_length = min_length
        self.short = short
        self.weight = 0
        self._entries: OrderedDict[tuple[Hashable, bytes], tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __call__(self, scope: Hashable, text: str, compute: Callable[[str], _R]) -> _R:
        if len(text) < self.min_length:
            return compute(text) if self.short is None else self.short(scope, text, compute)
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16, key=_KEY).digest()
        key = (scope, digest)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return cast(_R, self._entries[key][0])
        result = compute(text)
        weight = 1 + (len(result) if isinstance(result, tuple) else 0)
        with self._lock:
            self.misses += 1
            if weight > self.max_weight // 8 or key in self._entries:
                return result  # one text's findings may not push out most of the others
            self._entries[key] = (result, weight)
            self.weight += weight
            while self.weight > self.max_weight:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.weight -= dropped
        return result

    def clear(self) -> None:
        if self.short is not None:
            self.short.clear()
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = self.weight = 0

    def __len__(self) -> int:
        return len(self._entries)


# One memo per process for every matcher: the scopes keep their results apart.
MEMO = TextMemo(short=TextMemo(max_weight=SHORT_MAX_WEIGHT, min_length=0))
