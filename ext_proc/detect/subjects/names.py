"""NAME forms: every rendering of a declared person's name.

Called by ext_proc.detect.subjects.values for each declared name. Tokens are split on spaces,
hyphens, periods and commas (apostrophes join); honorifics are dropped; a comma means surname
first. The forms are token orders, initials with the surname, given name with surname initials,
and significant tokens alone (counted only when capitalised in the text); a one-token name that is
a common word is never matched alone.
"""

from __future__ import annotations

import itertools

import regex

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.forms import APOSTROPHES, MARK, REGEX_TIMEOUT, Case, FormList, FormSet, unique
from ext_proc.detect.subjects.reading import key_of, segments_of
from ext_proc.detect.subjects.words import PARTICLES, is_common_word, is_significant, word_list

HONORIFICS = frozenset(
    word_list("mr mrs ms mx miss mister dr prof sir dame madam madame rev fr sr jr ii iii iv esq phd md")
)
_NAME_WORDS = regex.compile(r"[\s.,;/]+")
MAX_ARRANGED_TOKENS = 4


def _name_words(text: str) -> list[list[str]]:
    """The words of a folded name, each as its class segments, honorifics left out."""
    words = []
    for word in _NAME_WORDS.split(text, timeout=REGEX_TIMEOUT):
        parts = segments_of(word)
        if parts and "".join(parts) not in HONORIFICS:
            words.append(parts)
    return words


def name_forms(value: str) -> FormList:
    """The forms of one declared name."""
    folded = APOSTROPHES.sub("", fold(value), timeout=REGEX_TIMEOUT)
    forms = FormSet()
    everything = key_of(folded)
    head, comma, tail = folded.partition(",")
    if comma and _name_words(head) and _name_words(tail):
        surname_words, given_words = _name_words(head), _name_words(tail)
    else:
        words = _name_words(folded)
        surname_words, given_words = words[-1:], words[:-1]
    given = [p for w in given_words for p in w]
    surname = [p for w in surname_words for p in w]
    # Particles just before the surname belong to it ("Ludwig van Beethoven").
    while given and given[-1] in PARTICLES:
        surname.insert(0, given.pop())
    tokens = given + surname
    if len(tokens) <= 1:
        token = tokens[0] if tokens else everything
        # A common word or a particle ("Will", "Grace", "Van") is never matched alone, capitalised
        # or not: "Will you help?" is no mention of anyone. What it is written with still is.
        if not (is_common_word(token) or token in PARTICLES):
            forms.add(token, Case.CAPITALISED if is_significant(token) else Case.CAPITALISED_ONLY)
        if everything != token:
            forms.add(everything, Case.ANY if len(everything) >= 3 else Case.CAPITALISED_ONLY)
        return forms.result()

    def add(parts: list[str], case: Case = Case.ANY) -> None:
        parts = [p for p in parts if p]
        key = "".join(parts)
        if len(key) < 3:
            return
        # Tokens that spell a common word when joined ("will" + "ow") keep their separator.
        form = MARK.join(parts) if len(parts) > 1 and is_common_word(key) else key
        forms.add(form, case)

    add(segments_of(folded))  # as declared, honorifics included
    add(tokens)
    significant = [t for t in unique(tokens) if is_significant(t)]
    pool = tokens if len(tokens) <= MAX_ARRANGED_TOKENS else significant[:MAX_ARRANGED_TOKENS]
    if len(tokens) > MAX_ARRANGED_TOKENS:
        add(list(reversed(tokens)))
        add(surname + given)
    for size in range(2, len(pool) + 1):
        for arrangement in itertools.permutations(pool, size):
            if size == len(pool) or any(is_significant(t) for t in arrangement):
                add(list(arrangement))

    core_given = [t for t in given if t not in PARTICLES]
    core_surname = [t for t in surname if t not in PARTICLES] or surname
    if core_given and surname:
        initials = "".join(t[0] for t in core_given)
        for surname_parts in _unique_lists([surname, core_surname]):
            for initial in unique([initials, core_given[0][0]]):
                add([initial, *surname_parts])
                add([*surname_parts, initial])
                if len(surname_parts) > 1:
                    add([initial, *(p[0] for p in surname_parts[:-1]), surname_parts[-1]])
        if len(core_surname) > 1:
            for part in core_surname:
                for initial in unique([initials, core_given[0][0]]):
                    add([initial, part])
                    add([part, initial])
        surname_initials = "".join(t[0] for t in core_surname)
        if len(initials) + len(surname_initials) >= 3:
            # One part per letter ("and" needs "A.N.D."), in capitals only.
            add(list(initials + surname_initials), Case.UPPER_ONLY)
        for name in core_given:
            if is_significant(name):
                add([name, surname_initials])
                add([name, core_surname[0][0]])
    for token in tokens:
        if is_significant(token):
            forms.add(token, Case.CAPITALISED)
    return forms.result()


def _unique_lists(lists: list[list[str]]) -> list[list[str]]:
    seen: dict[tuple[str, ...], list[str]] = {}
    for item in lists:
        if item:
            seen.setdefault(tuple(item), item)
    return list(seen.values())
