"""The placeholder maps: which placeholder each original of a request gets.

Redaction (ext_proc.transform.redact) asks a map for the placeholder of each detected value; the
map remembers the original, which restore (ext_proc.restore) puts back in the reply. How a
placeholder is written and read is ext_proc.transform.grammar.

Per-request placeholders (the default) carry a per-request random nonce: restore touches only
this request's placeholders, so a user who types `<EMAIL_1>` into a prompt gets it back unchanged.

Consistent pseudonyms (`consistentPseudonyms: true`) carry instead the first PSEUDONYM_HEX_CHARS
lowercase hex digits of HMAC-SHA256 under the tenant's pseudonym key (derived from TENANT_SECRET,
ext_proc.storage.vault) of the label and the normalised original, so the same value gets the same
placeholder in every request of the tenant, and another tenant gets another one. 80 bits: two of
a tenant's values share a digest with probability about n² / 2⁸¹ (10⁻⁷ for a billion values), and
a request that would put two values under one placeholder fails instead.

Labels of consistent pseudonyms must not depend on the request: a subject's position in the
header (`SUBJECT2_NAME`) changes with the order the caller lists its subjects in, so a declared
subject's finding is labelled `SUBJECT_{KIND}` (`SUBJECT_NAME`, `SUBJECT_EMAIL`). The model sees
that the value was declared, and which kind it is, but not which subject of this request it
belongs to; a catalog `EMAIL` and a declared subject's email are different labels, so the same
address found both ways gets two placeholders.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import unicodedata
from dataclasses import dataclass, field
from typing import Protocol

import regex

from ext_proc.detect.normalize import INVISIBLE
from ext_proc.errors import CordonError
from ext_proc.transform.grammar import (
    NONCE_HEX_CHARS,
    PSEUDONYM_HEX_CHARS,
    PSEUDONYM_LABELS,
    format_placeholder,
    format_pseudonym,
)

_PSEUDONYM_LABEL_SET = frozenset(PSEUDONYM_LABELS)
_SUBJECT_POSITION = regex.compile(r"SUBJECT[0-9]+_")


class Placeholders(Protocol):
    """What redaction writes placeholders through: one placeholder per (label, original), and the
    request's nonce (by which the egress check knows this request's own markers)."""

    nonce: str

    def placeholder_for(self, label: str, original: str) -> str: ...

    def pseudonyms(self) -> frozenset[str]:
        """The consistent pseudonyms this request wrote (none for per-request placeholders):
        the egress check reads them as separators, like the placeholders of its nonce."""
        ...


def new_nonce() -> str:
    return secrets.token_hex(NONCE_HEX_CHARS // 2)


@dataclass(slots=True)
class PlaceholderMap:
    """This request's placeholders: the same original under the same label gets the same placeholder.

    `originals` maps the canonical placeholder text (exactly as `format_placeholder` writes it) to the
    original text. It never leaves the process: not logged, not stored, not in a receipt.
    """

    nonce: str = field(default_factory=new_nonce)
    originals: dict[str, str] = field(default_factory=dict)
    _by_value: dict[tuple[str, str], str] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)

    def placeholder_for(self, label: str, original: str) -> str:
        key = (label, original)
        existing = self._by_value.get(key)
        if existing is not None:
            return existing
        index = self._counts.get(label, 0) + 1
        self._counts[label] = index
        text = format_placeholder(label, self.nonce, index)
        self._by_value[key] = text
        self.originals[text] = original
        return text

    def __len__(self) -> int:
        return len(self.originals)

    def __bool__(self) -> bool:
        return bool(self.originals)

    def pseudonyms(self) -> frozenset[str]:
        return frozenset()  # its placeholders carry the nonce


# --- consistent pseudonyms ----------------------------------------------------------------------


class PseudonymCollision(CordonError, ValueError):
    """Two different values of one request would share a placeholder (never expected at 80 bits).

    Raised rather than restoring one value in place of the other; the message names no value.
    """


def stable_label(label: str) -> str:
    """The label a consistent pseudonym carries: `SUBJECT3_NAME` → `SUBJECT_NAME`, others as they are."""
    return _SUBJECT_POSITION.sub("SUBJECT_", label, count=1) if label.startswith("SUBJECT") else label


def normalise_value(original: str) -> str:
    """What the digest is taken of: NFC, without invisible characters.

    Only differences a reader cannot see are folded (an `é` composed or decomposed, a zero-width
    space), so texts that share a placeholder look the same wherever it is restored. Case,
    spacing and punctuation stay: `Jane@Example.com` and `jane@example.com` are two values.
    """
    if original.isascii():
        return original
    return unicodedata.normalize("NFC", "".join(c for c in original if c not in INVISIBLE))


def pseudonym_digest(key: bytes, label: str, original: str) -> str:
    """HMAC-SHA256(key, label ‖ NUL ‖ UTF-8 of the normalised value), first PSEUDONYM_HEX_CHARS hex.

    Labels are `[A-Z0-9_]`, so the NUL makes the input unambiguous.
    """
    message = label.encode("ascii") + b"\x00" + normalise_value(original).encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:PSEUDONYM_HEX_CHARS]


@dataclass(slots=True)
class PseudonymMap:
    """This request's consistent pseudonyms: HMAC-derived, the same in every request of the tenant.

    `originals` maps each placeholder this request wrote (as `format_pseudonym` writes it) to its
    original text: what the vault stores (encrypted) and what restore reads first. `key` is the
    tenant's pseudonym key. `nonce` is a per-request random value that appears in no placeholder:
    the egress check reads this request's strip markers as separators by it, and reads consistent
    pseudonyms as ordinary text. None of these fields is ever logged (no repr).
    """

    key: bytes = field(repr=False)
    nonce: str = field(default_factory=new_nonce)
    originals: dict[str, str] = field(default_factory=dict, repr=False)
    _by_value: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)

    def placeholder_for(self, label: str, original: str) -> str:
        key = (label, original)
        existing = self._by_value.get(key)
        if existing is not None:
            return existing
        stable = stable_label(label)
        if stable not in _PSEUDONYM_LABEL_SET:
            raise ValueError(f"label {stable} is not one restore looks for (PSEUDONYM_LABELS)")
        text = format_pseudonym(stable, pseudonym_digest(self.key, stable, original))
        earlier = self.originals.get(text)
        if earlier is None:
            self.originals[text] = original
        elif normalise_value(earlier) != normalise_value(original):
            raise PseudonymCollision(f"two values of one request share the pseudonym digest of a {stable}")
        self._by_value[key] = text
        return text

    def __len__(self) -> int:
        return len(self.originals)

    def __bool__(self) -> bool:
        return bool(self.originals)

    def pseudonyms(self) -> frozenset[str]:
        return frozenset(self.originals)
