"""The output gate's reading (ext_proc.restore.output_gate): whole strings, JSON replies, stream windows."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import SETS
from ext_proc.exchange.reply import build_output_gate
from ext_proc.restore.output_gate import WINDOW, OutputGate
from ext_proc.restore.restorers import SurrogateRestorer
from ext_proc.transform.egress import neutralise_own_markers
from tests.support.e2e import SAMPLES, SENTENCE
from tests.support.examples import example_count

ALL = Catalog.for_sets(SETS)
NONCE = "0a1b2c3d"
SECRETS = {kind: SAMPLES[kind] for kind in ("OPENAI_KEY", "GITHUB_TOKEN", "AWS_ACCESS_KEY", "EMAIL")}


def gate() -> OutputGate:
    return OutputGate(ALL, lambda text: neutralise_own_markers(text, NONCE))


def test_a_whole_string_is_read_and_counted_by_distinct_value() -> None:
    g = gate()
    text = f"Your key is {SAMPLES['OPENAI_KEY']}; again: {SAMPLES['OPENAI_KEY']}. Mail {SAMPLES['EMAIL']}."
    assert g.read(text)
    assert g.read(text)  # said twice: the same distinct values
    assert g.tripped and g.counts() == {"EMAIL": 1, "OPENAI_KEY": 1}


def test_nothing_in_ordinary_text() -> None:
    g = gate()
    assert not g.read("The weather in Lisbon is mild; take a light jacket for the evening.")
    assert not g.tripped and g.counts() == {}


def test_this_requests_placeholders_are_never_findings() -> None:
    g = gate()
    text = f"I wrote to <EMAIL_{NONCE}_1> and <SUBJECT1_PHONE_{NONCE}_2>, and logged [CREDIT_CARD]."
    assert not g.read(text)
    assert g.counts() == {}


def test_a_json_reply_is_read_in_every_channel_but_not_its_ids() -> None:
    g = gate()
    reply = {
        "id": "resp_" + "9f" * 24,  # an id: bookkeeping, long and random-looking
        "object": "response",
        "output": [
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "the key " + SAMPLES["GITHUB_TOKEN"]}],
            },
            {"type": "function_call", "name": "send", "arguments": '{"to": "' + SAMPLES["EMAIL"] + '"}'},
            {"type": "message", "content": [{"type": "output_text", "text": "Done."}]},
        ],
    }
    assert g.read_tree(reply)
    assert g.counts() == {"EMAIL": 1, "GITHUB_TOKEN": 1}


def test_a_reply_nested_past_the_walk_is_still_read() -> None:
    node: object = {"text": "token " + SAMPLES["GITHUB_TOKEN"]}
    for _ in range(100):
        node = {"content": [node]}
    g = gate()
    assert g.read_tree(node) and g.counts() == {"GITHUB_TOKEN": 1}


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_a_value_split_across_deltas_is_seen(kind: str) -> None:
    value = SECRETS[kind]
    text = f"Here it is: {value} - keep it safe."
    g = gate()
    window = g.window()
    tripped = False
    for i in range(0, len(text), 3):
        window.feed(text[i : i + 3])
        tripped = g.check_windows() or tripped  # deny: every chunk read before it is released
    g.finish_windows()
    assert tripped and g.counts().get(kind) == 1


def test_report_mode_reads_a_stream_in_few_scans_with_the_same_counts() -> None:
    text = f"Key {SAMPLES['OPENAI_KEY']}, mail {SAMPLES['EMAIL']}, again {SAMPLES['EMAIL']}. " * 3
    g = gate()
    window = g.window()
    for i in range(0, len(text), 2):
        window.feed(text[i : i + 2])
    assert not g.tripped  # nothing read yet: under report the channel is read at its end
    assert g.finish_windows()
    assert g.counts() == {"EMAIL": 1, "OPENAI_KEY": 1}


def test_a_window_never_forgets_a_long_run_of_small_deltas() -> None:
    """A value arriving one character at a time after a long text is read whole."""
    g = gate()
    window = g.window()
    for ch in "lorem ipsum " * 200 + SAMPLES["EMAIL"] + " end":
        window.feed(ch)
        g.check_windows()
    g.finish_windows()
    assert g.counts() == {"EMAIL": 1}


SPLITS = {
    "kind": st.sampled_from(sorted(SECRETS)),
    "before": st.text(alphabet="abc xyz.,\n", max_size=WINDOW * 2),
    "cuts": st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=60),
}


def assert_seen_however_cut(kind: str, before: str, cuts: list[int]) -> None:
    text = f"{before} {SECRETS[kind]} tail"
    g = gate()
    window = g.window()
    at, tripped, turn = 0, False, 0
    while at < len(text):
        size = cuts[turn % len(cuts)]
        window.feed(text[at : at + size])
        tripped = g.check_windows() or tripped
        at, turn = at + size, turn + 1
    g.finish_windows()
    assert tripped and g.counts().get(kind, 0) >= 1


@settings(max_examples=example_count(120), deadline=None)
@given(**SPLITS)
def test_no_split_hides_a_value(kind: str, before: str, cuts: list[int]) -> None:
    """Wherever the chunks are cut, a value in the stream trips the gate and is counted."""
    assert_seen_however_cut(kind, before, cuts)


@pytest.mark.slow
@settings(max_examples=10000, deadline=None)
@given(**SPLITS)
def test_no_split_hides_a_value_many(kind: str, before: str, cuts: list[int]) -> None:
    assert_seen_however_cut(kind, before, cuts)


@settings(max_examples=example_count(40), deadline=None)
@given(size=st.integers(min_value=1, max_value=9), seed=st.integers(0, 2**16))
def test_a_placeholder_being_streamed_is_never_a_finding(size: int, seed: int) -> None:
    """Half a placeholder at the end of what has arrived (`SUBJECT1_NAME_3f9a1c`: a 20-character
    token) waits for the rest instead of being read as HIGH_ENTROPY; whole ones are separators;
    the window never starts inside one (`EDIT_CARD_3f9a1c2e_1>`)."""
    from ext_proc.exchange.reply import build_output_gate
    from ext_proc.restore.restorers import Restorer
    from ext_proc.transform.placeholders import PlaceholderMap

    pmap = PlaceholderMap()
    labels = ["SUBJECT1_NAME", "SUBJECT2_ADDRESS", "CREDIT_CARD", "EMAIL", "HIGH_ENTROPY"]
    rng = random.Random(seed)
    words = []
    for i in range(160):  # past WINDOW: the window slides over whole and half placeholders
        words.append(rng.choice(["see", "the", "file", "for", "details"]))
        if i % 4 == 0:
            words.append(pmap.placeholder_for(rng.choice(labels), f"value {i}"))
    text = " ".join(words)
    g = build_output_gate(ALL, Restorer(pmap), deny=True)
    window = g.window("content")
    for at in range(0, len(text), size):
        window.feed(text[at : at + size])
        assert not g.check_windows()
    g.finish_windows()
    assert not g.tripped and g.counts() == {}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("card 4532015112830366 or 4532 0151 1283 0366 or 4532-0151-1283-0366", "CREDIT_CARD"),
        ("call (212) 555-0199 or 212-555-0199 or +1 212 555 0199", "PHONE"),
        ("GB33BUKB20201555555555\nGB33 BUKB 2020 1555 5555 55", "IBAN"),
        ("Mail Orla.Brennick@Example.net or orla.brennick@example.net", "EMAIL"),
    ],
)
def test_one_value_in_several_layouts_counts_once(text: str, kind: str) -> None:
    g = OutputGate(ALL, lambda t: t)
    assert g.read(text)
    assert g.counts() == {kind: 1}


def test_a_surrogate_is_never_decided_in_halves() -> None:
    """A surrogate holds spaces (`+1 212-555-0143`, a card in groups): a delta that ends after
    one, right before a word, once let the gate decide `+1 ` and read the rest later on its own,
    as a phone number; under load Envoy hands over such deltas, and a surrogate tenant's reply
    was refused. Every start position and delta size of a reply that echoes the surrogates."""
    kinds = [
        "EMAIL",
        "PHONE",
        "CREDIT_CARD",
        "SSN",
        "IBAN",
        "IP",
        "AWS_ACCESS_KEY",
        "GITHUB_TOKEN",
        "OPENAI_KEY",
    ]
    restorer = SurrogateRestorer({SAMPLES[kind]: "x" for kind in kinds}, "0123abcd")
    counted = []
    for pad in range(0, 140, 3):
        text = "word " * (pad // 5) + SENTENCE + " and " + SENTENCE
        for size in (120, 97, 64):
            gate = build_output_gate(ALL, restorer, deny=True)
            window = gate.window(("chat", 0, "content"))
            for start in range(0, len(text), size):
                window.feed(text[start : start + size])
                gate.check_windows()
            gate.finish_windows()
            if gate.counts():
                counted.append((pad, size, sorted(gate.counts())))
    assert not counted, counted


def test_a_surrogate_the_model_rewrote_in_another_layout_is_not_a_finding() -> None:
    """Surrogate mode: the model may write the request's fictional phone number in its own
    layout; the original number, or any other, is still a finding."""
    restorer = SurrogateRestorer({"+1 634 555 0152": "+1 212 555 0143"}, NONCE)
    for written in ("(634) 555-0152", "634-555-0152", "+1-634-555-0152", "1 634 555 0152"):
        gate = build_output_gate(ALL, restorer, deny=True)
        assert not gate.read(f"call {written} today"), written
    for other in ("(212) 555-0143", "+1 415 555 0177"):
        gate = build_output_gate(ALL, restorer, deny=True)
        assert gate.read(f"call {other} today"), other
