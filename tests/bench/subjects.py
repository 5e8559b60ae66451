"""Microbenchmark of the declared-subject matchers (ext_proc.detect.subjects.matcher); not a test.

Run: `.venv/bin/python -m tests.bench.subjects` (add `--rounds N` for more repetitions).

Prints the minimum and the median over the rounds:
- compile: a header of 8 subjects declaring every kind, from empty caches (the compiled-header LRU
  and the per-value form cache both cleared before each round; the process has already loaded the
  common-word list and phonenumbers' metadata, which happens once per worker at start-up, and that
  first-ever compile is printed separately);
- detect, first_survivor and both together on an 8 KB chat-like ASCII text holding a few
  occurrences of declared identifiers, and the same for a text with accented (non-ASCII) words;
- first_survivor over the strings of a 200-string body (the egress check's call pattern).
Targets (issue 3): compile ≤ 5 ms; detect + first_survivor ≤ 1 ms on 8 KB.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import clear_caches, compile_subjects

GIVEN = ["Marisol", "Tobiah", "Ingrid", "Olusegun", "Hyacinth", "Radomir", "Saoirse", "Teodoro"]
SURNAMES = [
    "Quintero-Vance",
    "Okonkwo",
    "Lindqvist",
    "Adeyemi-Cole",
    "Brannigan",
    "Zelenko",
    "Fairweather",
    "Almeida",
]
STREETS = [
    "Elm Street",
    "Oak Rd",
    "Harbor Blvd",
    "Maple Ave",
    "Cedar Lane",
    "Birch Ct",
    "Pine Pkwy",
    "Aspen Way",
]

FILLER = [
    "please",
    "summarize",
    "the",
    "following",
    "support",
    "conversation",
    "and",
    "draft",
    "a",
    "polite",
    "reply",
    "that",
    "explains",
    "the",
    "refund",
    "policy",
    "and",
    "the",
    "next",
    "steps",
    "for",
    "the",
    "customer",
    "in",
    "plain",
    "language",
    "the",
    "order",
    "was",
    "delayed",
    "twice",
    "and",
    "the",
    "tracking",
    "page",
    "showed",
    "no",
    "updates",
    "for",
    "a",
    "week",
    "we",
    "want",
    "to",
    "keep",
    "the",
    "tone",
    "friendly",
    "and",
    "avoid",
    "promising",
    "dates",
    "we",
    "cannot",
    "meet",
]


def header(salt: str = "") -> str:
    subjects = []
    for i in range(8):
        subjects.append(
            {
                "names": [f"{GIVEN[i]} {SURNAMES[i]}"],
                "emails": [f"{GIVEN[i].lower()}.{i}{salt}@example.com"],
                "phones": [f"+1 404-555-01{i:02d}"],
                "addresses": [f"{1400 + i} {STREETS[i]} Apt {i + 1}, Atlanta"],
                "dates": [f"198{i}-0{(i % 9) + 1}-1{i}"],
                "ids": [f"A{1234560 + i}{salt}"],
                "handles": [f"{GIVEN[i].lower()}{i}{salt}"],
                "other": [f"Project Bluebird {i}"],
            }
        )
    return encode_subject_header({"ref": f"bench{salt}", "subjects": subjects})


def chat_text(size: int = 8192, accented: bool = False) -> str:
    rng = random.Random(7)
    words = list(FILLER)
    if accented:
        words += ["café", "naïve", "résumé", "über", "façade", "déjà", "crème", "señor"]
    inserts = [
        "Marisol Quintero-Vance",
        "call her at (404) 555-0100",
        "she lives at 1400 Elm St",
        "born January 10, 1980",
        "ticket from tobiah1",
    ]
    out: list[str] = []
    length = 0
    step = size // (len(inserts) + 1)
    next_insert = step
    while length < size:
        word = rng.choice(words)
        if length >= next_insert and inserts:
            word = inserts.pop(0) + "."
            next_insert += step
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def timed_us(
    fn: Callable[[], object], rounds: int, inner: int = 1, setup: Callable[[], object] | None = None
) -> tuple[float, float]:
    """(minimum, median) microseconds per call; the minimum is the figure least disturbed by other
    work on a shared machine, the median the typical one."""
    samples = []
    for _ in range(rounds):
        if setup is not None:
            setup()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return min(samples) * 1e6, statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()

    raw = header()
    start = time.perf_counter()
    compiled = compile_subjects(parse_subject_header(raw))
    first = (time.perf_counter() - start) * 1e3
    parsed = parse_subject_header(raw)

    low, mid = timed_us(lambda: compile_subjects(parsed), args.rounds, setup=clear_caches)
    compiled = compile_subjects(parsed)
    print(
        f"compile, 8 subjects x 8 kinds, empty caches: min {low / 1e3:.2f} ms, "
        f"median {mid / 1e3:.2f} ms (target <= 5 ms)"
    )
    print(f"  first compile in this process (loads word list, phone metadata): {first:.2f} ms")
    print(f"  forms: {compiled.form_count}")

    for label, text in (("ASCII", chat_text()), ("accented", chat_text(accented=True))):
        findings = compiled.detect(text)
        assert compiled.first_survivor(text) is not None
        redacted = text
        for finding in reversed(findings):
            redacted = redacted[: finding.start] + "<X>" + redacted[finding.end :]
        detect = timed_us(lambda text=text: compiled.detect(text), args.rounds, 20)
        survivor = timed_us(lambda text=redacted: compiled.first_survivor(text), args.rounds, 20)
        print(
            f"{label} 8 KB ({len(text)} chars, {len(findings)} findings): "
            f"detect min {detect[0]:.0f} / median {detect[1]:.0f} us; "
            f"first_survivor (on the redacted text) min {survivor[0]:.0f} / median {survivor[1]:.0f} us; "
            f"together min {detect[0] + survivor[0]:.0f} / median {detect[1] + survivor[1]:.0f} us "
            "(target <= 1000 us)"
        )

    words = chat_text().split()
    strings = [" ".join(words[i : i + 6]) for i in range(0, len(words), 6)][:200]
    strings += ["role", "content", "user", "assistant", "model", "gpt-4o"] * 10
    body = timed_us(lambda: [compiled.first_survivor(s) for s in strings], args.rounds, 5)
    print(
        f"first_survivor over {len(strings)} strings ({sum(map(len, strings))} chars): "
        f"min {body[0]:.0f} / median {body[1]:.0f} us"
    )


if __name__ == "__main__":
    main()
