"""The placeholder grammar (SPEC §8), shared by redaction (which writes them) and restore.

A placeholder is `<{LABEL}_{nonce}_{i}>`: LABEL is a kind (`EMAIL`, `CREDIT_CARD`) or a subject
label (`SUBJECT1_NAME`), `nonce` a per-request random value of lowercase hex, `i` the 1-based index
of the distinct original under that label. The nonce is what makes restore touch only this
request's placeholders: a user who types `<EMAIL_1>` into a prompt gets it back unchanged.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

NONCE_HEX_CHARS = 8


def new_nonce() -> str:
    return secrets.token_hex(NONCE_HEX_CHARS // 2)


def format_placeholder(label: str, nonce: str, index: int) -> str:
    return f"<{label}_{nonce}_{index}>"


def strip_marker(label: str) -> str:
    """What `strip` mode writes instead of a reversible placeholder."""
    return f"[{label}]"


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
