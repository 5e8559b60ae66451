"""The bench's table: a line's samples, target and verdict (`Row`, `Target`), how the sections are
printed, and `Plan`, how many repetitions and seconds each line gets."""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    op: str  # "<=" or ">="
    limit: float
    text: str

    def met(self, value: float) -> bool:
        return value <= self.limit if self.op == "<=" else value >= self.limit


@dataclass(slots=True)
class Row:
    name: str
    unit: str
    samples: list[float]  # one per repetition
    target: Target | None = None
    detail: str = ""
    signed: bool = False

    @property
    def value(self) -> float:
        return statistics.median(self.samples)

    def fmt(self, x: float) -> str:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
        return f"{x:+,.{digits}f}" if self.signed else f"{x:,.{digits}f}"

    def cells(self) -> list[str]:
        spread = f"{self.fmt(min(self.samples))} – {self.fmt(max(self.samples))}"
        if len(self.samples) == 1:
            spread = "(one run)"
        verdict = "info" if self.target is None else "PASS" if self.target.met(self.value) else "FAIL"
        target = self.target.text if self.target else ""
        return [self.name, f"{self.fmt(self.value)} {self.unit}", spread, target, verdict, self.detail]


Section = tuple[str, list[Row]]
WIDTHS = (56, 16, 22, 16, 6)


def print_table(sections: list[Section]) -> None:
    header = ["line", "median", "min – max", "target", "result", "detail"]
    print("  ".join(h.ljust(w) for h, w in zip(header, (*WIDTHS, 0), strict=True)).rstrip())
    for title, rows in sections:
        print(f"-- {title}")
        for row in rows:
            cells = row.cells()
            print("  ".join(c.ljust(w) for c, w in zip(cells, (*WIDTHS, 0), strict=True)).rstrip())


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    ordered = sorted(samples)
    return ordered[max(0, min(len(ordered), math.ceil(q * len(ordered))) - 1)]


def ms(seconds: float) -> float:
    return seconds * 1000


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Plan:
    """How much of everything: `--quick` for a smoke run, the default for figures to keep."""

    reps: int
    latency_n: int
    load_seconds: float
    big_n: int
    pipeline_rounds: int
    sse_rounds: int
    ttft_n: int
    rss_seconds: float

    @classmethod
    def for_run(cls, quick: bool) -> Plan:
        if quick:
            return cls(2, 150, 2.0, 2, 2, 5, 3, 5.0)
        return cls(5, 500, 5.0, 5, 5, 20, 8, 30.0)
