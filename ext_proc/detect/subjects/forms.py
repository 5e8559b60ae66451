"""What a form is: the vocabulary shared by the generators of every declared kind.

A declared value (ext_proc.detect.subjects.header) is compiled into *forms*, one per rendering:
strings of letters and digits (the rendering with its separators taken out), with MARK where the
text must have a separator, each counting under a `Case`. The per-kind generators (names, contacts,
dates, addresses, values) build them with a `FormSet`; the matcher (ext_proc.detect.subjects.matcher)
looks them up in the text's class segments (ext_proc.detect.subjects.reading).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

import regex

from ext_proc.errors import CordonError

REGEX_TIMEOUT = 0.25  # seconds per regex call while compiling a value (the matcher scales it by length)
MARK = "\x00"  # in a form string: a separator is required here
APOSTROPHES = regex.compile(r"['’‘`´ʼʻʹ]")  # joined, not separators, in names and street names


class Case(IntEnum):
    """When a form counts, by the case of the original text (detect) and at egress."""

    ANY = 0  # any case, both readers
    CAPITALISED = 1  # detect: only with a capital letter in the match; egress: any case
    CAPITALISED_ONLY = 2  # detect: only with a capital letter; egress: never (a common word)
    # A name's initials alone ("MQV", "M.Q.V."): both readers, only written in capitals. In
    # lower case three letters are a word or part of an identifier (`lookup_mqv_rules`), not
    # the person's initials.
    UPPER_ONLY = 3


class UnreadableValue(CordonError):
    """A declared value the generators cannot understand; the message names the problem, not the value."""


# (form, Case, weak) triples. A weak form is a partial rendering (an email's local part alone):
# where its key is also a full form of another label, the other label names the match.
FormList = tuple[tuple[str, Case, bool], ...]


class FormSet:
    """An ordered set of forms; a form added twice keeps its most permissive Case."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[Case, bool]] = {}

    def add(self, form: str, case: Case = Case.ANY, weak: bool = False) -> None:
        if not form.replace(MARK, ""):
            return
        known = self.items.get(form)
        if known is None:
            self.items[form] = (case, weak)
        else:
            self.items[form] = (min(case, known[0]), weak and known[1])

    def result(self) -> FormList:
        return tuple((form, case, weak) for form, (case, weak) in self.items.items())


def unique(items: Iterable[str]) -> list[str]:
    """The non-empty items, first occurrence kept, in order."""
    return list(dict.fromkeys(i for i in items if i))


def split_marks(form: str) -> tuple[str, frozenset[int]]:
    """A form as its key (letters and digits) and the offsets in the key that need a separator."""
    if MARK not in form:
        return form, frozenset()
    key = ""
    required = set()
    for part in form.split(MARK):
        if key:
            required.add(len(key))
        key += part
    return key, frozenset(required)
