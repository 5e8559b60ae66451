"""`python -m tests.bench.run --extensions`: what a policy's own kinds and deny list cost.

The cold and tiny latency lines of `make bench`, run twice in one stack: under the plain default
policy, and under a tenant (selected by its API key) with 20 custom kinds and 1,000 deny terms,
invented here so that none of them occurs in the bench bodies (the lines time the reading, not
extra redaction). An in-process line beside them times the catalog alone over the 8 KB body's
strings, both ways, in this one process (one core).
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import ALL_SETS
from ext_proc.policy.load import parse_policy
from ext_proc.transform.walk import parse_json
from tests.support.harness import KEYS

TENANT = "extend"  # a tenant name of harness.KEYS; the bench gives it the policy below
CUSTOM_KINDS = 20
DENY_TERMS = 1000
_SYLLABLES = ("vor", "qua", "zel", "mip", "tro", "nax", "bel", "kur", "dos", "fyn", "lom", "gre")


def _codename(n: int) -> str:
    """An invented two-word code name per n (never an English word, never in a bench body)."""
    a, b, c = n % 12, (n // 12) % 12, (n // 144) % 12
    return f"{_SYLLABLES[a].title()}{_SYLLABLES[b]} {_SYLLABLES[c].title()}x{n}"


def policy_text() -> str:
    """The extended tenant's knobs (YAML, without the tenant and key lines harness writes)."""
    lines = ["customKinds:"]
    for i in range(CUSTOM_KINDS):
        lines.append(f"  - name: BENCH_KIND_{chr(ord('A') + i)}")
        lines.append(f"    pattern: 'Q{i:02d}-[A-Z]{{3}}\\d{{5}}'")
        if i % 2:
            lines.append("    context: [ticket, case]")
        if i % 5 == 0:
            lines.append("    validate: luhn")
    lines.append("deny:")
    lines += [f"  - {_codename(n)}" for n in range(DENY_TERMS)]
    return "\n".join(lines) + "\n"


def auth_header() -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[TENANT]}"}


def catalog_in_process(body: bytes, rounds: int) -> tuple[list[float], list[float]]:
    """Milliseconds per 8 KB body for the catalog alone, (plain, extended): each round reads every
    message string once, each string made new (the catalog's memo would otherwise answer)."""
    extended = parse_policy(Path("bench-extended.yaml"), _policy_mapping())
    catalogs = (
        Catalog.for_sets(ALL_SETS),
        Catalog.for_sets(ALL_SETS, extensions=extended.extensions),
    )
    texts = [m["content"] for m in parse_json(body.decode())["messages"]]
    out: tuple[list[float], list[float]] = ([], [])
    for round_ in range(rounds):
        for catalog, samples in zip(catalogs, out, strict=True):
            fresh = [f"{text} r{round_}x{id(samples)}" for text in texts]
            start = time.perf_counter()
            for text in fresh:
                catalog.detect(text)
            samples.append((time.perf_counter() - start) * 1000)
    return out


def _policy_mapping() -> dict[str, object]:
    data = yaml.safe_load(policy_text())
    assert isinstance(data, dict)
    return {"tenant": "bench-extended", **data}
