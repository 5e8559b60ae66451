"""Conformance of the pattern catalog against other detectors' test expectations.

Where it sits: a measuring tool beside the test suite, not part of the request path. It reads the
peer corpus (`../shared/peer/*.jsonl` from the repository root: presidio, detect-secrets,
gitleaks, Cordon and llm-guard test cases extracted as data), runs every text through
`scan --jsonl` (in process through `ext_proc.cli.scan.run`, or as a subprocess of
`python -m ext_proc scan --jsonl` with `--subprocess`), and compares.

Per kind (the table per source file):

* A peer's entity type, rule id or plugin name is mapped to our kinds by the explicit tables of
  `tests.support.peer_tables`; a type the catalog does not cover is excluded and counted as out
  of scope.
* Recall: share of `should_match: true` cases whose expected substrings (or spans, or count) are
  covered by findings of the mapped kinds. False-flag rate: share of `should_match: false` cases
  with any finding of the mapped kinds.
* A case is one row and one of our kinds (a multi-entity row yields one case per in-scope kind).

Vendor secrets (one line under the table): every row of gitleaks.jsonl and detect_secrets.jsonl,
whatever its rule id or plugin, mapped or not.

* Recall: a `should_match: true` row is found when findings of any kind of the `secrets` set (or
  of the row's mapped kinds: detect-secrets' IP rows are `pii`) cover its expected substrings, or
  are as many as its expected count.
* False flags, of the row's kind: a `should_match: false` row says that its text holds no
  credential of the row's rule ("no GitLab token here"), not that it holds no secret at all: its
  texts often carry another vendor's token, a signature or a value under a secret key on purpose.
  So a row counts as flagged when it has a finding of its mapped kinds, or, for a rule without
  one, of a specific credential kind (the `secrets` set without SECRET_ASSIGNMENT and
  HIGH_ENTROPY, which make no claim about a vendor). The rate of rows with a finding of any
  `secrets` kind is printed beside it, for information.
* Core recall: the adjusted recall over the presidio, Cordon and llm-guard cases in scope.

Rows we deliberately disagree with are listed in `DISAGREEMENTS` with the reason; they are
reported, and excluded from the adjusted figures that the test holds to its thresholds.

    .venv/bin/python -m tests.support.conformance            # table per source file and overall
    .venv/bin/python -m tests.support.conformance --cases    # also every failing case (kinds, offsets)

Output names kinds, offsets and row numbers, never a corpus value.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ext_proc.detect.findings import CATALOG_KINDS, SETS
from tests.support.peer_tables import (
    _PII_PCI,
    _SECRETS,
    CORDON,
    CORDON_DETECTION_ROWS,
    DETECT_SECRETS,
    DISAGREEMENTS,
    GITLEAKS,
    LLM_GUARD,
    OUT_OF_SCOPE_NOTES,
    PRESIDIO,
    Disagreement,
    Kinds,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = Path(os.environ.get("CORDON_PEER_CORPUS", REPO_ROOT / ".." / "shared" / "peer"))
SOURCES = ("presidio", "detect_secrets", "gitleaks", "cordon", "llm_guard")

RECALL_TARGET = 0.95
FALSE_FLAG_TARGET = 0.05
VENDOR_SOURCES = ("gitleaks", "detect_secrets")
# Adjusted (DISAGREEMENTS excluded), and raw: the raw false flags are the deliberate ones, held
# where they are so a new one is a decision, not a drift.
VENDOR_RECALL_TARGET = 0.98
VENDOR_RAW_RECALL_TARGET = 0.94
VENDOR_FALSE_FLAG_TARGET = 0.01
VENDOR_RAW_FALSE_FLAG_LIMIT = 0.14
CORE_SOURCES = ("presidio", "cordon", "llm_guard")
CORE_RECALL_TARGET = 0.98
# The kinds that say "a credential of this vendor": every secrets kind but the generic two.
SPECIFIC_SECRETS: Kinds = tuple(k for k in _SECRETS if k not in ("SECRET_ASSIGNMENT", "HIGH_ENTROPY"))

__all__ = ["DISAGREEMENTS", "OUT_OF_SCOPE_NOTES", "Disagreement"]

# --- cases ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Case:
    source: str
    row: int  # 1-based line number in the corpus file
    peer_type: str
    kinds: Kinds
    should_match: bool
    text: str
    substrings: tuple[str, ...] = ()
    spans: tuple[tuple[int, int], ...] = ()
    count: int = 1
    disagreement: str | None = None
    passed: bool | None = None
    detail: str = ""
    any_secret: bool = False  # a finding of any secrets kind (vendor false flags, for information)


@dataclass(slots=True)
class Corpus:
    cases: list[Case] = field(default_factory=list)
    out_of_scope: Counter[str] = field(default_factory=Counter)  # source → rows
    vendor: list[Case] = field(default_factory=list)  # every gitleaks and detect-secrets row


def _expectation(row: dict[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...], int]:
    expected = row.get("expected")
    spans = tuple(tuple(s) for s in row.get("expected_spans") or ())
    if isinstance(expected, list):
        subs = tuple(s for s in expected if isinstance(s, str) and s)
        return subs, spans, max(1, len(subs))
    if isinstance(expected, int):
        return (), spans, max(1, expected)
    return (), spans, 1


def _typed_rows(source: str, table: dict[str, Kinds], type_key: str, corpus: Corpus) -> None:
    for number, row in _rows(source):
        peer_type = row.get(type_key) or row.get("entity_type") or ""
        kinds = table.get(peer_type)
        if kinds is None:
            corpus.out_of_scope[source] += 1
            continue
        subs, spans, count = _expectation(row)
        corpus.cases.append(
            Case(source, number, peer_type, kinds, bool(row["should_match"]), row["text"], subs, spans, count)
        )


_PLACEHOLDER = re.compile(r"<([A-Z][A-Z0-9_]*?)_(?:\{N\}_\d+|\[0-9A-F\]\{8\})>|\[([A-Z][A-Z0-9_]*)\]")
_KIND_NAME = re.compile(r"[A-Z][A-Z0-9_]*|validator:[A-Za-z0-9]+")


def _cordon_kinds(entries: Iterable[str]) -> list[str]:
    names: list[str] = []
    for entry in entries:
        if _KIND_NAME.fullmatch(entry):
            names.append(entry)
        else:
            names.extend(a or b for a, b in _PLACEHOLDER.findall(entry))
    return names


def _cordon_rows(corpus: Corpus) -> None:
    for number, row in _rows("cordon"):
        if row.get("kind") not in CORDON_DETECTION_ROWS:
            corpus.out_of_scope["cordon"] += 1
            continue
        names = _cordon_kinds(row.get("expected_kinds_or_placeholders") or [])
        should_match = bool(row["should_match"])
        if not should_match and row.get("kind") in ("redact", "proxy"):
            corpus.out_of_scope["cordon"] += 1  # policy switches, not detection
            continue
        if not should_match and not names:
            # "nothing is found": every kind of the row's sets (all sets when none are named).
            sets = [s for s in (row.get("sets") or SETS) if s in SETS]
            kinds = tuple(k for s in sets for k in SETS[s])
            corpus.cases.append(Case("cordon", number, "(none)", kinds, False, row["text"]))
            continue
        wanted = Counter(n for n in names if n in CORDON)
        if not wanted:
            corpus.out_of_scope["cordon"] += 1
            continue
        for name, count in wanted.items():
            peer_type = f"{row.get('source_path')}:{name}" if row.get("kind") == "fuzz_seed" else name
            corpus.cases.append(
                Case("cordon", number, peer_type, CORDON[name], should_match, row["text"], count=count)
            )


_LLM_GUARD_PLACEHOLDER = re.compile(r"\[REDACTED_([A-Z_]+?)_\d+\]|<([A-Z_]+)>|(\*{6,})|\[REDACTED\]")


def _align(text: str, redacted: str) -> list[tuple[str, str | None]] | None:
    """(original substring, label) for each placeholder of an llm-guard redacted text."""
    for width in (40, 30, 20, 12):
        at = redacted.find(text[:width])
        if at >= 0:
            redacted = redacted[at:]  # drop the scanner's preamble
            break
    labels: list[str | None] = []
    pattern = ["^"]
    last = 0
    for m in _LLM_GUARD_PLACEHOLDER.finditer(redacted):
        pattern.append(re.escape(redacted[last : m.start()]))
        pattern.append("(.+?)")
        labels.append(m.group(1) or m.group(2))
        last = m.end()
    pattern.append(re.escape(redacted[last:]) + "$")
    found = re.match("".join(pattern), text, re.DOTALL)
    if found is None:
        return None
    return list(zip(found.groups(), labels, strict=True))


def _llm_guard_rows(corpus: Corpus) -> None:
    for number, row in _rows("llm_guard"):
        path = row.get("source_path", "")
        entity = row.get("entity_type", "")
        if "test_regex" in path:
            corpus.out_of_scope["llm_guard"] += 1
            continue
        if not row["should_match"]:
            kinds = LLM_GUARD.get(entity) or _PII_PCI  # MULTI: the anonymizer's default entities
            corpus.cases.append(Case("llm_guard", number, entity, kinds, False, row["text"]))
            continue
        pairs = _align(row["text"], row.get("expected_redacted_text", ""))
        if pairs is None:
            corpus.out_of_scope["llm_guard"] += 1
            continue
        by_kinds: dict[Kinds, list[str]] = {}
        for substring, label in pairs:
            label_kinds = LLM_GUARD.get(label or entity)
            if label_kinds is not None:
                by_kinds.setdefault(label_kinds, []).append(substring)
        if not by_kinds:
            corpus.out_of_scope["llm_guard"] += 1
            continue
        for kinds, subs in by_kinds.items():
            peer_type = "SECRET" if kinds == _SECRETS else kinds[0]
            corpus.cases.append(
                Case("llm_guard", number, peer_type, kinds, True, row["text"], tuple(subs), count=len(subs))
            )


def _vendor_rows(corpus: Corpus) -> None:
    """Every gitleaks and detect-secrets row as one vendor case (module docstring: the kinds)."""
    for source, table, type_key in (
        ("gitleaks", GITLEAKS, "rule_id"),
        ("detect_secrets", DETECT_SECRETS, ""),
    ):
        for number, row in _rows(source):
            peer_type = (row.get(type_key) if type_key else None) or row.get("entity_type") or ""
            mapped: Kinds = table.get(peer_type) or ()
            should_match = bool(row["should_match"])
            if should_match:
                kinds: Kinds = tuple(dict.fromkeys((*_SECRETS, *mapped)))
            else:
                kinds = mapped or SPECIFIC_SECRETS
            subs, spans, count = _expectation(row)
            corpus.vendor.append(
                Case(source, number, peer_type, kinds, should_match, row["text"], subs, spans, count)
            )


def _rows(source: str) -> Iterable[tuple[int, dict[str, Any]]]:
    with open(CORPUS_DIR / f"{source}.jsonl", encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                yield number, json.loads(line)


def load_corpus() -> Corpus:
    corpus = Corpus()
    _typed_rows("presidio", PRESIDIO, "entity_type", corpus)
    _typed_rows("detect_secrets", DETECT_SECRETS, "entity_type", corpus)
    _typed_rows("gitleaks", GITLEAKS, "rule_id", corpus)
    _cordon_rows(corpus)
    _llm_guard_rows(corpus)
    _vendor_rows(corpus)
    for case in (*corpus.cases, *corpus.vendor):
        for entry in DISAGREEMENTS:
            if entry.covers(case):
                case.disagreement = entry.reason
    return corpus


def corpus_available() -> bool:
    return all((CORPUS_DIR / f"{s}.jsonl").is_file() for s in SOURCES)


# --- running scan ---------------------------------------------------------------------------------


def scan_jsonl(texts: Sequence[str], *, subprocess_mode: bool = False) -> list[list[dict[str, Any]]]:
    """Findings for each text, through the `scan --jsonl` command."""
    payload = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    if subprocess_mode:
        done = subprocess.run(
            [sys.executable, "-m", "ext_proc", "scan", "--jsonl"],
            input=payload,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scan --jsonl exited {done.returncode}")
        output = done.stdout
    else:
        from ext_proc.cli import scan

        parser = argparse.ArgumentParser()
        scan.add_arguments(parser)
        out = io.StringIO()
        status = scan.run(parser.parse_args(["--jsonl"]), io.StringIO(payload), out)
        if status != 0:
            raise RuntimeError(f"scan --jsonl returned {status}")
        output = out.getvalue()
    lines = [json.loads(line)["findings"] for line in output.splitlines() if line.strip()]
    if len(lines) != len(texts):
        raise RuntimeError("scan --jsonl wrote a different number of lines than it read")
    return lines


def _occurrences(text: str, sub: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    at = text.find(sub)
    while at >= 0:
        out.append((at, at + len(sub)))
        at = text.find(sub, at + 1)
    return out


def judge(case: Case, findings: list[dict[str, Any]]) -> None:
    mine = sorted({(f["start"], f["end"]) for f in findings if f["kind"] in case.kinds})

    def covered(span: tuple[int, int]) -> bool:
        return any(s <= span[0] and span[1] <= e for s, e in mine)

    if not case.should_match:
        case.passed = not mine
        case.detail = "" if case.passed else f"flagged {len(mine)} span(s) at {mine[:4]}"
        return
    if case.spans:
        missing = [sp for sp in case.spans if not covered(sp)]
        case.passed = not missing
        case.detail = "" if case.passed else f"uncovered spans {missing}"
        return
    if case.substrings:
        problems: list[str] = []
        for sub, need in Counter(case.substrings).items():
            spans = _occurrences(case.text, sub)
            hit = sum(1 for sp in spans if covered(sp))
            if not spans:
                problems.append(f"expected substring of length {len(sub)} not in text")
            elif hit < min(need, len(spans)):
                problems.append(f"uncovered {[sp for sp in spans if not covered(sp)][:3]}")
        case.passed = not problems
        case.detail = "; ".join(problems)
        return
    case.passed = len(mine) >= case.count
    case.detail = "" if case.passed else f"found {len(mine)} of {case.count} expected"


def evaluate(corpus: Corpus, *, subprocess_mode: bool = False) -> Corpus:
    cases = [*corpus.cases, *corpus.vendor]
    results = scan_jsonl([c.text for c in cases], subprocess_mode=subprocess_mode)
    secrets = frozenset(_SECRETS)
    for case, findings in zip(cases, results, strict=True):
        judge(case, findings)
        case.any_secret = any(f["kind"] in secrets or f["kind"] in case.kinds for f in findings)
    return corpus


# --- figures ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    positives: int
    recalled: int
    negatives: int
    flagged: int

    @property
    def recall(self) -> float:
        return self.recalled / self.positives if self.positives else 1.0

    @property
    def false_flag_rate(self) -> float:
        return self.flagged / self.negatives if self.negatives else 0.0


def figures(cases: Iterable[Case], *, adjusted: bool) -> Figures:
    pos = rec = neg = flg = 0
    for case in cases:
        if adjusted and case.disagreement:
            continue
        if case.should_match:
            pos += 1
            rec += bool(case.passed)
        else:
            neg += 1
            flg += not case.passed
    return Figures(pos, rec, neg, flg)


def report(corpus: Corpus, *, show_cases: bool = False) -> str:
    lines = [
        f"{'source':15s} {'out of scope':>12s} {'cases':>6s} {'disagree':>8s}   "
        f"{'recall (adj)':>22s}   {'false flags (adj)':>22s}   {'recall (raw)':>12s} {'ff (raw)':>9s}"
    ]
    for source in (*SOURCES, "overall"):
        cases = [c for c in corpus.cases if source in ("overall", c.source)]
        oos = sum(corpus.out_of_scope.values()) if source == "overall" else corpus.out_of_scope[source]
        adj, raw = figures(cases, adjusted=True), figures(cases, adjusted=False)
        disagree = sum(1 for c in cases if c.disagreement)
        lines.append(
            f"{source:15s} {oos:12d} {len(cases):6d} {disagree:8d}   "
            f"{adj.recall:7.1%} ({adj.recalled:4d}/{adj.positives:4d})    "
            f"{adj.false_flag_rate:6.1%} ({adj.flagged:3d}/{adj.negatives:4d})      "
            f"{raw.recall:12.1%} {raw.false_flag_rate:9.1%}"
        )
    lines.append("")
    lines.extend(vendor_lines(corpus))
    stale = stale_disagreements(corpus)
    if stale:
        lines.append(f"stale disagreements (now agree): {stale}")
    if show_cases:
        lines.append("")
        for label, cases in (("", corpus.cases), ("vendor ", corpus.vendor)):
            for c in cases:
                if not c.passed:
                    mark = label + ("disagree" if c.disagreement else "FAIL")
                    lines.append(
                        f"{mark:15s} {c.source}:{c.row} {c.peer_type} "
                        f"kinds={','.join(c.kinds) if len(c.kinds) < 4 else f'{len(c.kinds)} kinds'} "
                        f"should_match={c.should_match} {c.detail}"
                    )
    return "\n".join(lines)


def core_cases(corpus: Corpus) -> list[Case]:
    return [c for c in corpus.cases if c.source in CORE_SOURCES]


def vendor_any_secret_rate(corpus: Corpus) -> float:
    """Share of the vendor `should_match: false` rows with a finding of any secrets kind."""
    negatives = [c for c in corpus.vendor if not c.should_match]
    return sum(c.any_secret for c in negatives) / len(negatives) if negatives else 0.0


def vendor_lines(corpus: Corpus) -> list[str]:
    raw, adj = figures(corpus.vendor, adjusted=False), figures(corpus.vendor, adjusted=True)
    core_raw, core_adj = (
        figures(core_cases(corpus), adjusted=False),
        figures(core_cases(corpus), adjusted=True),
    )
    return [
        f"vendor secrets ({' + '.join(VENDOR_SOURCES)}, every row; {len(corpus.vendor)} rows, "
        f"{sum(1 for c in corpus.vendor if c.disagreement)} disagree):",
        f"  recall                        {adj.recall:6.1%} adj ({adj.recalled}/{adj.positives})   "
        f"{raw.recall:6.1%} raw ({raw.recalled}/{raw.positives})",
        f"  false flags (row's kind)      {adj.false_flag_rate:6.1%} adj ({adj.flagged}/{adj.negatives})   "
        f"{raw.false_flag_rate:6.1%} raw ({raw.flagged}/{raw.negatives})",
        f"  false flags (any secret kind) {vendor_any_secret_rate(corpus):6.1%} raw (for information)",
        f"core recall ({', '.join(CORE_SOURCES)})  {core_adj.recall:6.1%} adj ({core_adj.recalled}/"
        f"{core_adj.positives})   {core_raw.recall:6.1%} raw ({core_raw.recalled}/{core_raw.positives})",
    ]


def stale_disagreements(corpus: Corpus) -> list[tuple[int, str, str]]:
    """Entries of `DISAGREEMENTS` (index, source, peer type) whose rows all agree now, in the
    per-kind and the vendor cases."""
    stale: list[tuple[int, str, str]] = []
    for index, entry in enumerate(DISAGREEMENTS):
        covered = [c for c in (*corpus.cases, *corpus.vendor) if entry.covers(c)]
        if covered and all(c.passed for c in covered):
            stale.append((index, entry.source, entry.peer_type))
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.conformance", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--cases", action="store_true", help="list every failing case")
    parser.add_argument(
        "--subprocess", action="store_true", help="run `python -m ext_proc scan --jsonl` as a subprocess"
    )
    args = parser.parse_args(argv)
    if not corpus_available():
        print(f"peer corpus not found at {CORPUS_DIR}", file=sys.stderr)
        return 2
    corpus = evaluate(load_corpus(), subprocess_mode=args.subprocess)
    print(report(corpus, show_cases=args.cases))
    overall = figures(corpus.cases, adjusted=True)
    vendor, vendor_raw = figures(corpus.vendor, adjusted=True), figures(corpus.vendor, adjusted=False)
    core = figures(core_cases(corpus), adjusted=True)
    ok = (
        overall.recall >= RECALL_TARGET
        and overall.false_flag_rate <= FALSE_FLAG_TARGET
        and vendor.recall >= VENDOR_RECALL_TARGET
        and vendor_raw.recall >= VENDOR_RAW_RECALL_TARGET
        and vendor.false_flag_rate <= VENDOR_FALSE_FLAG_TARGET
        and vendor_raw.false_flag_rate <= VENDOR_RAW_FALSE_FLAG_LIMIT
        and core.recall >= CORE_RECALL_TARGET
    )
    return 0 if ok else 1


assert set(
    k for t in (PRESIDIO, DETECT_SECRETS, GITLEAKS, CORDON, LLM_GUARD) for ks in t.values() for k in ks
) <= set(CATALOG_KINDS)

if __name__ == "__main__":
    raise SystemExit(main())
