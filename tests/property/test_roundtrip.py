"""restore(redact(x)) == x through the real catalog, overlap resolution and rewrite, and nothing
the catalog flagged survives redaction.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.restore.restorers import Restorer
from ext_proc.restore.stream import StreamRestorer
from ext_proc.transform.placeholders import PlaceholderMap
from ext_proc.transform.redact import resolve_overlaps, reversible, rewrite, strip
from tests.support.examples import example_count

CATALOG = Catalog.for_sets(("pii", "pci", "secrets"))


def luhn_complete(prefix: str) -> str:
    digits = [int(d) for d in prefix]
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 0:
            d *= 2
            d = d - 9 if d > 9 else d
        total += d
    return prefix + str((10 - total % 10) % 10)


emails = st.builds(
    lambda user, domain: f"{user}@{domain}.example",
    st.text("abcdefghijklmnopqrstuvwxyz0123456789._", min_size=1, max_size=12).filter(
        lambda u: u[0].isalnum() and u[-1].isalnum() and ".." not in u
    ),
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=10),
)
cards = st.builds(lambda body: luhn_complete("4" + body), st.text("0123456789", min_size=14, max_size=14))
github_tokens = st.builds(
    lambda s: "ghp_" + s, st.text("ABCDEFGHabcdefgh0123456789", min_size=36, max_size=36)
)
ssns = st.sampled_from(["123-45-6789", "219-09-9999", "078-05-1121"])
entities = st.one_of(emails, cards, github_tokens, ssns)
# Filler that cannot itself form an entity: words and punctuation, no digits, no '@'.
filler = st.text(st.sampled_from(list("abcdefghij klmnop,.;:!?()'\"<>_-\n")), max_size=30)


@st.composite
def texts_with_entities(draw: st.DrawFn) -> tuple[str, list[str]]:
    parts: list[str] = []
    planted: list[str] = []
    for _ in range(draw(st.integers(1, 5))):
        parts.append(draw(filler))
        entity = draw(entities)
        planted.append(entity)
        parts.append(f" {entity} ")
    parts.append(draw(filler))
    return "".join(parts), planted


def redact(text: str, pmap: PlaceholderMap) -> tuple[str, Counter[str]]:
    counts: Counter[str] = Counter()
    return rewrite(text, resolve_overlaps(CATALOG.detect(text)), reversible(pmap), counts), counts


def check_roundtrip(sample: tuple[str, list[str]], splits: list[int]) -> None:
    text, planted = sample
    pmap = PlaceholderMap()
    redacted, counts = redact(text, pmap)
    for entity in planted:
        assert entity not in redacted, "a planted entity survived redaction"
    assert sum(counts.values()) >= 1
    restorer = Restorer(pmap)
    assert restorer.restore_text(redacted) == text
    stream = StreamRestorer(restorer)
    cuts = sorted({min(c, len(redacted)) for c in splits})
    pieces, last = [], 0
    for cut in [*cuts, len(redacted)]:
        pieces.append(stream.feed(redacted[last:cut]))
        last = cut
    pieces.append(stream.flush())
    assert "".join(pieces) == text


@settings(max_examples=example_count(300), suppress_health_check=[HealthCheck.too_slow])
@given(sample=texts_with_entities(), splits=st.lists(st.integers(0, 400), max_size=8))
def test_restore_of_redact_is_the_identity(sample: tuple[str, list[str]], splits: list[int]) -> None:
    check_roundtrip(sample, splits)


@pytest.mark.slow
@settings(max_examples=5000, suppress_health_check=[HealthCheck.too_slow])
@given(sample=texts_with_entities(), splits=st.lists(st.integers(0, 400), max_size=8))
def test_restore_of_redact_is_the_identity_many(sample: tuple[str, list[str]], splits: list[int]) -> None:
    check_roundtrip(sample, splits)


@settings(max_examples=example_count(200))
@given(sample=texts_with_entities())
def test_strip_mode_leaves_kinds_and_no_entity(sample: tuple[str, list[str]]) -> None:
    text, planted = sample
    out = rewrite(text, resolve_overlaps(CATALOG.detect(text)), strip, Counter())
    for entity in planted:
        assert entity not in out
    assert "[" in out
