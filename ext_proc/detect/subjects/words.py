"""Common words: which declared tokens are too ordinary to identify someone on their own.

The form generators (ext_proc.detect.subjects.names, .contacts, .addresses) ask here whether a
token is significant: a name token, an email's local part or a street name that is a common word
("Will", "Grace", "Oak") is matched only in combination with the rest of its value.
"""

from __future__ import annotations

from functools import cache
from importlib import resources


def word_list(text: str) -> tuple[str, ...]:
    """A word list written as one string (easier to read and edit than a list literal)."""
    return tuple(text.split())


PARTICLES = frozenset(
    word_list(
        "de da das dos do del della dello di du la le les van von der den ter ten bin binti ibn bint al el "
        "y e st mac"
    )
)
_PLURAL_ES = ("s", "x", "z", "ch", "sh")


@cache
def common_words() -> frozenset[str]:
    """The shipped list of common English words (ext_proc/detect/subjects/data/common_words.txt)."""
    text = (
        resources.files("ext_proc.detect.subjects")
        .joinpath("data/common_words.txt")
        .read_text(encoding="utf-8")
    )
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def is_common_word(token: str) -> bool:
    """A common word, or a regular plural of one ("wells", "banks", "boxes", "daisies")."""
    words = common_words()
    if token in words:
        return True
    if token.endswith("ies") and token[:-3] + "y" in words:
        return True
    if token.endswith("es") and token[:-2].endswith(_PLURAL_ES) and token[:-2] in words:
        return True
    return token.endswith("s") and token[:-1] in words


def is_significant(token: str) -> bool:
    """A token that identifies on its own: 3+ letters, not a number, a particle or a common word."""
    return len(token) >= 3 and not token.isdigit() and token not in PARTICLES and not is_common_word(token)
