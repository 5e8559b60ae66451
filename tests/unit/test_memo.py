"""The per-process memo of detection results (ext_proc.detect.memo): reuse, never a failure, no text kept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog import regexes
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import SETS
from ext_proc.detect.memo import TextMemo
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.errors import DetectionError
from tests.support.e2e import SAMPLES
from tests.support.examples import example_count

ALL = Catalog.for_sets(SETS)
LONG = "Write to " + SAMPLES["EMAIL"] + " or call " + SAMPLES["PHONE"] + " about the invoice for March."


def test_a_result_is_computed_once_per_scope_and_text() -> None:
    memo = TextMemo(min_length=4)
    calls: list[str] = []

    def compute(text: str) -> int:
        calls.append(text)
        return len(text)

    assert memo("a", "some text", compute) == 9
    assert memo("a", "some text", compute) == 9
    assert memo("b", "some text", compute) == 9  # another scope: its own entry
    assert memo("a", "other text", compute) == 10
    assert len(calls) == 3 and memo.hits == 1 and memo.misses == 3


def test_short_texts_are_not_kept() -> None:
    memo = TextMemo(min_length=10)
    assert memo("a", "short", len) == 5
    assert len(memo) == 0


def test_the_memo_keeps_digests_not_text() -> None:
    memo = TextMemo(min_length=4)
    memo("scope", LONG, len)
    ((scope, digest),) = memo._entries
    assert scope == "scope" and isinstance(digest, bytes) and len(digest) == 16
    assert SAMPLES["EMAIL"].encode() not in digest


def test_it_is_bounded_by_weight() -> None:
    memo = TextMemo(max_weight=24, min_length=1)
    for i in range(10):
        memo("s", f"text {i}", lambda text: (1, 2))  # weight 3 each
    assert len(memo) == 8 and memo.weight == 24
    memo("s", "large", lambda text: tuple(range(10)))  # heavier than an eighth: not kept
    assert len(memo) == 8 and memo.weight == 24


def test_a_failure_is_not_remembered() -> None:
    memo = TextMemo(min_length=1)
    attempts = 0

    def flaky(text: str) -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise DetectionError("timed out")
        return 1

    with pytest.raises(DetectionError):
        memo("s", "text", flaky)
    assert memo("s", "text", flaky) == 1 and attempts == 2


def test_a_catalog_timeout_still_fails_after_the_text_was_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text scanned before is answered from the memo; a new one under a timeout still fails."""
    assert ALL.detect(LONG)
    monkeypatch.setattr(regexes, "REGEX_TIMEOUT", 1e-9)
    assert ALL.detect(LONG)  # remembered: the same pure result
    with pytest.raises(DetectionError):
        ALL.detect(("1 2-3." * 50_000) + ("a@" * 50_000))


def test_catalogs_of_different_sets_do_not_share_results() -> None:
    pii, secrets = Catalog.for_sets(["pii"]), Catalog.for_sets(["secrets"])
    text = LONG + " key " + SAMPLES["OPENAI_KEY"]
    assert {f.kind for f in pii.detect(text)} == {"EMAIL", "PHONE"}
    assert "OPENAI_KEY" in {f.kind for f in secrets.detect(text)}
    assert not {"EMAIL", "PHONE"} & {f.kind for f in secrets.detect(text)}


def test_subject_headers_do_not_share_results() -> None:
    def compiled(name: str):  # type: ignore[no-untyped-def]
        return compile_subjects(
            parse_subject_header(encode_subject_header({"ref": name, "subjects": [{"names": [name]}]}))
        )

    text = "Please send the March invoice to Marisol Quintero before the end of the week."
    assert [f.kind for f in compiled("Marisol Quintero").detect(text)] == ["NAME"]
    assert compiled("Jonas Albrecht").detect(text) == []
    assert compiled("Marisol Quintero").first_survivor(text) is not None
    assert compiled("Jonas Albrecht").first_survivor(text) is None


@settings(max_examples=example_count(200), deadline=None)
@given(
    st.lists(st.sampled_from([*SAMPLES.values(), "word", " ", "\n", "12", "-", "@", "x" * 30]), max_size=30)
)
def test_remembered_findings_equal_a_fresh_scan(pieces: list[str]) -> None:
    text = "".join(pieces)
    fresh = list(ALL._detect_checked(text)) if len(text) >= 3 else []
    assert ALL.detect(text) == fresh
    assert ALL.detect(text) == fresh  # the second answer comes from the memo


def test_short_texts_have_a_memo_of_their_own() -> None:
    """A role or a model name, repeated by every request, is scanned once; it never takes the
    place of a long text."""
    memo = TextMemo(max_weight=16, min_length=10, short=TextMemo(max_weight=16, min_length=0))
    calls: list[str] = []

    def compute(text: str) -> int:
        calls.append(text)
        return len(text)

    memo("s", "a much longer text", compute)
    for word in ("user", "assistant", "stop", "user", "assistant"):
        memo("s", word, compute)
    assert len(calls) == 4 and len(memo) == 1 and memo.short is not None and len(memo.short) == 3
    memo.clear()
    assert len(memo) == 0 and len(memo.short) == 0
