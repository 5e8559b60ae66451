"""A policy's deny terms, compiled once: every occurrence in a text, whatever its disguise.

Where this sits: `Catalog` (ext_proc.detect.catalog.engine) runs a `DenyList` over the canonical
view of every text it reads (and of its decoded views), next to the detectors, and reports each
occurrence as the kind `DENY_TERM`. The canonical view has already read look-alike letters,
invisible characters and typographic spaces as ASCII; here a term and a text are both read as
words (runs of letters and digits), each case-folded, and a term matches a run of whole words
whose letters and digits, joined, are the term's joined: so `Project Nightingale` is found as
`project-nightingale`, `PROJECT_NIGHTINGALE`, `ProjectNightingale` and `P r o j e c t  N i g h t
i n g a l e`, but never inside a longer word (`Nightingales`).

The terms are not looped over: they are one set of joined keys and one set of their prefixes, and
a text costs one set lookup per word (a few more where a word begins a term), so a thousand terms
cost what ten do.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import regex

from ext_proc.detect.canonical import canonical_text
from ext_proc.detect.normalize import fold

# A word of the canonical view: letters and digits (of any script), nothing else.
_WORD = regex.compile(r"[^\W_]+")

DENY_KIND = "DENY_TERM"
MAX_TERM_CHARS = 200


@functools.lru_cache(maxsize=65536)
def term_key(term: str) -> str:
    """What a term is compared as: its canonical view's letters and digits, case-folded, joined."""
    return "".join(fold(word) for word in _WORD.findall(canonical_text(term)))


# ASCII: every character but a letter or a digit separates words (then `str.split`, in C).
_ASCII_SEPARATORS = {c: " " for c in range(128) if not chr(c).isalnum()}


@dataclass(frozen=True, slots=True)
class DenyList:
    """The compiled terms: joined keys, their proper prefixes, and the longest key's length."""

    keys: frozenset[str]
    prefixes: frozenset[str]
    starts: frozenset[str]  # keys and prefixes: what a matching run's first word must be
    longest: int

    @classmethod
    def compile(cls, terms: Iterable[str]) -> DenyList:
        keys = frozenset(key for key in map(term_key, terms) if key)
        prefixes = frozenset(key[:n] for key in keys for n in range(1, len(key)))
        return cls(keys, prefixes, keys | prefixes, max(map(len, keys), default=0))

    def __bool__(self) -> bool:
        return bool(self.keys)

    def find(self, text: str) -> list[tuple[int, int]]:
        """The spans (in `text`, a canonical view) of every run of whole words that spells a term;
        where runs from one word overlap, the longest."""
        if not self.keys:
            return []
        if text.isascii():
            # Words are found and compared without their offsets, which only a match needs.
            words = text.lower().translate(_ASCII_SEPARATORS).split()
            runs = self._runs(words)
            if not runs:
                return []
            offsets = [m.span() for m in _WORD.finditer(text)]
        else:
            found = list(_WORD.finditer(text))
            runs = self._runs([fold(m.group()) for m in found])
            offsets = [m.span() for m in found]
        return [(offsets[first][0], offsets[last][1]) for first, last in runs]

    def _runs(self, words: list[str]) -> list[tuple[int, int]]:
        """(first, last) word indexes of each matching run: for each word that can begin a term,
        the longest run from it whose joined words are a term."""
        keys, prefixes, starts, longest = self.keys, self.prefixes, self.starts, self.longest
        count = len(words)
        runs: list[tuple[int, int]] = []
        for i, joined in enumerate(words):
            if joined not in starts:
                continue
            found = -1
            j = i
            while True:
                if joined in keys:
                    found = j
                j += 1
                if joined not in prefixes or j >= count:
                    break
                joined += words[j]
                if len(joined) > longest:
                    break
            if found >= 0:
                runs.append((i, found))
        return runs
