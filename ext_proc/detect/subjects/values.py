"""One declared value → its compiled forms: the kind → generator registry and the per-value cache.

Called by `compile_subjects` (ext_proc.detect.subjects.matcher) for every value of a parsed header.
Dispatches on the declared kind to its generator (names, contacts, dates, addresses, or the literal
letters and digits of an id, handle or other value), adds the spelled-out form of ligature letters,
and splits each form into its key, its required separators and every prefix the scan looks up,
and, for numbers (phones, ids), the prefixes after which the scan may pass over a few words.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.addresses import address_forms
from ext_proc.detect.subjects.contacts import email_forms, phone_forms
from ext_proc.detect.subjects.dates import date_forms
from ext_proc.detect.subjects.forms import Case, FormList, FormSet, UnreadableValue, split_marks
from ext_proc.detect.subjects.names import name_forms
from ext_proc.detect.subjects.reading import key_of

FORM_CACHE_SIZE = 4096  # compiled values kept across headers (a header that changes one value)
# Kinds whose digit groups are read across a few words between them ("404 then 555 and 0187"), when
# the form holds at least GAP_MIN_DIGITS digits: a shorter number written in words would be found in
# ordinary prose; seven digits in order, group by group, are not there by chance.
GAP_KINDS = frozenset({"PHONE", "ID", "HANDLE", "OTHER"})
GAP_MIN_DIGITS = 7


def literal_forms(value: str) -> FormList:
    """ID, HANDLE and OTHER: the value's letters and digits in order, nothing dropped."""
    key = key_of(fold(value))
    if not key:
        raise UnreadableValue("has no letter or digit")
    return ((key, Case.ANY, False),)


_LIGATURES = {"æ": "ae", "œ": "oe", "þ": "th", "ĳ": "ij"}

GENERATORS: dict[str, Callable[[str], FormList]] = {
    "NAME": name_forms,
    "EMAIL": email_forms,
    "PHONE": phone_forms,
    "ADDRESS": address_forms,
    "DOB": date_forms,
    "ID": literal_forms,
    "HANDLE": literal_forms,
    "OTHER": literal_forms,
}


def forms_of(kind: str, value: str) -> FormList:
    """The forms of one declared value. Raises UnreadableValue."""
    forms = GENERATORS[kind](value)
    joined = "".join(form for form, _, _ in forms)
    if any(ligature in joined for ligature in _LIGATURES):
        extra = FormSet()
        for form, case, weak in forms:
            extra.add(form, case, weak)
            spelled = form
            for ligature, letters in _LIGATURES.items():
                spelled = spelled.replace(ligature, letters)
            extra.add(spelled, case, weak)
        forms = extra.result()
    return forms


@dataclass(frozen=True, slots=True)
class ValueForms:
    """One declared value compiled: its form keys with their requirements, and all their prefixes."""

    forms: tuple[tuple[str, frozenset[int], Case, bool], ...]  # key, required separators, case, weak
    prefixes: frozenset[str]
    gap_prefixes: frozenset[str]  # prefixes ending inside a digit run of a number: a gap may follow


@lru_cache(maxsize=FORM_CACHE_SIZE)
def value_forms(kind: str, value: str) -> ValueForms:
    """The compiled forms of one declared value. Raises UnreadableValue.

    Cached across headers: a session whose header changes one value recompiles only that value.
    """
    forms = []
    for form, case, weak in forms_of(kind, value):
        key, required = split_marks(form)
        forms.append((key, required, case, weak))
    keys = [key for key, _, _, _ in forms]
    prefixes = _prefix_closure(keys)
    return ValueForms(tuple(forms), prefixes, _gap_prefixes(kind, keys, prefixes))


def _gap_prefixes(kind: str, keys: list[str], prefixes: frozenset[str]) -> frozenset[str]:
    """The prefixes of a number's keys that end between two of its digits ("404" of "4045550187")."""
    if kind not in GAP_KINDS:
        return frozenset()
    numbers = [key for key in keys if len(key) - len(key.translate(_NO_DIGITS)) >= GAP_MIN_DIGITS]
    if len(numbers) == len(keys) and all(map(str.isdigit, keys)):
        return prefixes  # a phone: every prefix ends between two digits (or is a whole key)
    out: set[str] = set()
    for key in numbers:
        out.update(key[:i] for i in range(1, len(key)) if key[i - 1].isdigit() and key[i].isdigit())
    return frozenset(out)


_NO_DIGITS = str.maketrans("", "", "0123456789")


def _prefix_closure(keys: Iterable[str]) -> frozenset[str]:
    """Every non-empty prefix of every key. Longest keys first, each stopping at the first prefix
    already present (the set is prefix-closed), so the cost is the size of the keys' trie rather
    than the sum of their lengths: the forms of one value share long prefixes."""
    prefixes: set[str] = set()
    for key in sorted(set(keys), key=len, reverse=True):
        for end in range(len(key), 0, -1):
            prefix = key[:end]
            if prefix in prefixes:
                break
            prefixes.add(prefix)
    return frozenset(prefixes)
