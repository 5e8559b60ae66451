"""Word lists: which declared tokens are too ordinary to identify someone on their own, and which
words may join the digit groups of a number.

The form generators (ext_proc.detect.subjects.names, .contacts, .addresses) ask here whether a
token is significant: a name token, an email's local part or a street name that is a common word
("Will", "Grace", "Oak") is matched only in combination with the rest of its value. The matcher's
scan (ext_proc.detect.subjects.matcher) reads a number's digit groups across `GAP_CONNECTORS`.
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

# Words that may stand between the digit groups of a phone number or an id, two or three at a time
# ("area code 404, then 555 and 0187", "404 followed by 555", "dash", "and then"). Any single word
# of a few letters may too; two ordinary words may not ("404 apples and 555 pears").
GAP_CONNECTORS = frozenset(
    word_list(
        "and then dash hyphen minus dot point period space plus comma slash colon underscore hash "
        "followed by area code country local next after that is its it the rest last digits finally "
        "lastly also with to or number no nr num ext extension line part of"
    )
)


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
