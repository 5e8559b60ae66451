"""Consistent pseudonyms (ext_proc/placeholders.py, ext_proc/restore.py): the HMAC-derived
placeholder grammar, its label scheme, injectivity, and restore from this request's map plus what
the vault returns (JSON bodies and the three SSE dialects, split anywhere, with the vault's answer
arriving between two runs over the same chunk). Pure functions: the vault here is a dict; the
Redis-backed one is tested in integration/test_vault.py and end to end in e2e/test_pseudonyms.py.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.dialects import DIALECTS
from ext_proc.restore.json_body import restore_json_body
from ext_proc.restore.restorers import PseudonymRestorer, restorer_for
from ext_proc.restore.sse import SseRestorer
from ext_proc.restore.stream import StreamRestorer
from ext_proc.transform import placeholders
from ext_proc.transform.egress import check_body
from ext_proc.transform.grammar import PSEUDONYM_HEX_CHARS, PSEUDONYM_LABELS
from ext_proc.transform.placeholders import (
    PseudonymCollision,
    PseudonymMap,
    pseudonym_digest,
    stable_label,
)
from tests.support.e2e import PERSON
from tests.support.examples import example_count
from tests.unit.test_restore import CHECKS, MANGLES, Expect, build, splits

KEY = bytes(range(32))  # a tenant's pseudonym key (derived from TENANT_SECRET in production)
OTHER_KEY = bytes(range(1, 33))
GRAMMAR = re.compile(rf"<([A-Z][A-Z0-9_]*)_([0-9a-f]{{{PSEUDONYM_HEX_CHARS}}})>")


# --- the grammar and its labels ---------------------------------------------------------------


def test_the_same_value_gets_the_same_placeholder_in_every_request() -> None:
    first, second = PseudonymMap(KEY), PseudonymMap(KEY)
    a = first.placeholder_for("EMAIL", "jane.roe@example.com")
    assert second.placeholder_for("PHONE", "+1 212-555-0143") != a
    assert second.placeholder_for("EMAIL", "jane.roe@example.com") == a
    assert GRAMMAR.fullmatch(a) and a.startswith("<EMAIL_")
    assert first.nonce != second.nonce  # the per-request nonce is in no placeholder
    assert first.nonce not in a


def test_another_tenant_key_gives_another_placeholder() -> None:
    value = "jane.roe@example.com"
    assert PseudonymMap(KEY).placeholder_for("EMAIL", value) != PseudonymMap(OTHER_KEY).placeholder_for(
        "EMAIL", value
    )


def test_declared_subjects_are_labelled_without_their_position() -> None:
    """SUBJECT{n} depends on the order of the header's subjects: the stable label drops n."""
    pmap = PseudonymMap(KEY)
    first = pmap.placeholder_for("SUBJECT1_NAME", "Marisol Quintero-Vance")
    assert first.startswith("<SUBJECT_NAME_")
    assert PseudonymMap(KEY).placeholder_for("SUBJECT7_NAME", "Marisol Quintero-Vance") == first
    assert pmap.placeholder_for("SUBJECT1_EMAIL", "mq@example.com").startswith("<SUBJECT_EMAIL_")
    # A catalog EMAIL and a declared email are different labels, so different placeholders.
    assert pmap.placeholder_for("EMAIL", "mq@example.com") != pmap.placeholder_for(
        "SUBJECT2_EMAIL", "mq@example.com"
    )
    assert stable_label("SUBJECT12_HANDLE") == "SUBJECT_HANDLE" and stable_label("EMAIL") == "EMAIL"


def test_every_label_redaction_can_write_is_one_restore_looks_for() -> None:
    from ext_proc.detect.findings import CATALOG_KINDS
    from ext_proc.detect.subjects.header import KINDS

    labels = {stable_label(k) for k in CATALOG_KINDS} | {stable_label(f"SUBJECT3_{k}") for k in KINDS}
    assert labels | {"DENY_TERM"} == set(PSEUDONYM_LABELS)  # and a policy's deny terms
    with pytest.raises(ValueError):
        PseudonymMap(KEY).placeholder_for("PASSPORT", "x")


def test_normalisation_folds_only_what_cannot_be_seen() -> None:
    pmap = PseudonymMap(KEY)
    composed = "Zoë Łukasiewicz"
    decomposed = unicodedata.normalize("NFD", composed)
    assert composed != decomposed
    assert pmap.placeholder_for("SUBJECT1_NAME", composed) == pmap.placeholder_for(
        "SUBJECT1_NAME", decomposed
    )
    assert pmap.placeholder_for("EMAIL", "jane@example.com") == pmap.placeholder_for(
        "EMAIL", "ja\u200bne@example.com"
    )
    assert pmap.placeholder_for("EMAIL", "Jane@example.com") != pmap.placeholder_for(
        "EMAIL", "jane@example.com"
    )
    assert (
        pmap.originals[pmap.placeholder_for("SUBJECT1_NAME", decomposed)] == composed
    )  # the first text seen


def test_one_hundred_thousand_values_get_one_hundred_thousand_digests() -> None:
    """Injective in practice: 100,000 distinct values (near neighbours on purpose), zero collisions,
    and every digest is exactly PSEUDONYM_HEX_CHARS lowercase hex digits."""
    values = [f"user{i}@example.com" for i in range(50_000)] + [f"+1 212-555-{i:05d}" for i in range(50_000)]
    assert len(set(values)) == 100_000
    digests = [pseudonym_digest(KEY, "EMAIL", value) for value in values]
    assert len(set(digests)) == 100_000
    assert all(len(d) == PSEUDONYM_HEX_CHARS and d.isalnum() and d == d.lower() for d in digests)
    pmap = PseudonymMap(KEY)
    placeholders_ = {pmap.placeholder_for("EMAIL", value) for value in values}
    assert len(placeholders_) == len(pmap) == 100_000


def test_two_values_sharing_a_digest_fail_rather_than_restore_one_as_the_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        placeholders, "pseudonym_digest", lambda key, label, original: "0" * PSEUDONYM_HEX_CHARS
    )
    pmap = PseudonymMap(KEY)
    pmap.placeholder_for("EMAIL", "jane@example.com")
    with pytest.raises(PseudonymCollision) as info:
        pmap.placeholder_for("EMAIL", "john@example.com")
    assert "example.com" not in str(info.value)


def test_the_map_never_shows_its_key_or_values() -> None:
    pmap = PseudonymMap(KEY)
    pmap.placeholder_for("EMAIL", "jane.roe@example.com")
    assert "jane" not in repr(pmap) and repr(KEY) not in repr(pmap) and KEY.hex() not in repr(pmap)


# --- restore: the map first, then the vault ----------------------------------------------------

TURN1 = PseudonymMap(KEY)  # an earlier request: its values are only in the vault now
EARLIER: list[tuple[str, str]] = [
    ("EMAIL", 'o"brien\\x@example.org'),
    ("SUBJECT1_NAME", 'Zoë "Z" Łukasiewicz\nsecond line'),
    ("CREDIT_CARD", "4111 1111 1111 1111"),
]
EARLIER_PH = [TURN1.placeholder_for(label, value) for label, value in EARLIER]
VAULT: dict[str, str] = dict(TURN1.originals)

NOW = PseudonymMap(KEY)  # this request
CURRENT: list[tuple[str, str]] = [("PHONE", "+1 (555) 010-9999"), ("SUBJECT2_HANDLE", "名前 テスト 🙂")]
NOW_PH = [NOW.placeholder_for(label, value) for label, value in CURRENT]
PH = NOW_PH + EARLIER_PH
ORIG = [value for _, value in CURRENT] + [value for _, value in EARLIER]
LOOK_ALIKES = [
    "<EMAIL_" + "0" * PSEUDONYM_HEX_CHARS + ">",  # the grammar, but nobody's value
    "<EMAIL_ab12cd34_1>",  # a per-request placeholder
    "<EMAIL_" + "f" * (PSEUDONYM_HEX_CHARS - 1) + ">",  # one digit short
    "EMAIL_" + "a" * PSEUDONYM_HEX_CHARS + "1",  # one digit long (a longer token)
    "<PASSPORT_" + "a" * PSEUDONYM_HEX_CHARS + ">",  # no such label
    "x" + EARLIER_PH[0][1:-1],  # inside a word
]


def vault_answer(vault: Mapping[str, str] | None, wanted: set[str]) -> dict[str, str]:
    return {} if vault is None else {p: vault[p] for p in wanted if p in vault}


def restore_text(text: str, vault: Mapping[str, str] | None = VAULT, *, json_escaped: bool = False) -> str:
    """What the exchange does with a JSON body: restore, look up what was missing, restore again."""
    restorer = PseudonymRestorer(NOW)
    first = restorer.restore_text(text, json_escaped=json_escaped)
    wanted = restorer.take_unresolved()
    if not wanted:
        return first
    restorer.learn(vault_answer(vault, wanted), wanted)
    again = restorer.restore_text(text, json_escaped=json_escaped)
    assert restorer.take_unresolved() == set()  # matching does not depend on what is known
    return again


@pytest.mark.parametrize("mangle", list(MANGLES))
@pytest.mark.parametrize("which", range(len(PH)))
def test_every_tolerated_form_restores_from_the_map_or_the_vault(mangle: str, which: int) -> None:
    text = f"Write to {MANGLES[mangle](PH[which])} today."
    assert restore_text(text) == f"Write to {ORIG[which]} today."


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_look_alikes_are_not_restored(text: str) -> None:
    assert restore_text(f"see {text}.") == f"see {text}."


def test_only_whole_candidates_are_looked_up_and_each_once() -> None:
    restorer = PseudonymRestorer(NOW)
    text = " ".join([*LOOK_ALIKES, EARLIER_PH[0], EARLIER_PH[0].upper(), NOW_PH[0]])
    restorer.restore_text(text)
    assert restorer.take_unresolved() == {EARLIER_PH[0], LOOK_ALIKES[0]}
    restorer.learn({EARLIER_PH[0]: EARLIER[0][1]}, {EARLIER_PH[0], LOOK_ALIKES[0]})
    restorer.restore_text(text)
    assert restorer.take_unresolved() == set()  # found and absent are both remembered


def test_vault_unavailable_restores_what_the_map_holds() -> None:
    text = f"{NOW_PH[0]} and {EARLIER_PH[0]}"
    assert restore_text(text, None) == f"{ORIG[0]} and {EARLIER_PH[0]}"


def test_lookups_are_bounded_per_exchange() -> None:
    restorer = PseudonymRestorer(NOW, max_lookups=2)
    many = [f"<EMAIL_{i:0{PSEUDONYM_HEX_CHARS}x}>" for i in range(5)]
    restorer.restore_text(" ".join(many))
    assert len(restorer.take_unresolved()) == 2 and restorer.skipped == 3
    restorer.restore_text(" ".join(many))
    assert restorer.take_unresolved() == set()


def test_json_escaped_insertion_keeps_tool_arguments_valid() -> None:
    args = json.dumps({"to": PH, "note": f"hi {PH[3]}"}).replace("<", "\\u003c")
    assert json.loads(restore_text(args, json_escaped=True)) == {"to": ORIG, "note": f"hi {ORIG[3]}"}


def test_has_any_needs_a_whole_digest_after_an_underscore() -> None:
    restorer = PseudonymRestorer(PseudonymMap(KEY))
    assert restorer.active  # even with an empty map: the vault may know
    assert restorer.has_any(EARLIER_PH[0]) and restorer.has_any(EARLIER_PH[0].upper().encode())
    assert restorer.has_any(EARLIER_PH[0].replace("_", "\\_"))
    assert not restorer.has_any("msg_" + "a" * 24) and not restorer.has_any(b"chatcmpl-" + b"a" * 20)
    assert not restorer.has_any("nothing here")


def test_a_key_outside_the_grammar_is_refused() -> None:
    pmap = PseudonymMap(KEY)
    pmap.originals["<EMAIL_ab12cd34_1>"] = "x"
    with pytest.raises(ValueError):
        PseudonymRestorer(pmap)
    assert isinstance(restorer_for(PseudonymMap(KEY)), PseudonymRestorer)


def test_restore_json_body_with_the_vault() -> None:
    content = f"Mail {EARLIER_PH[0]} for {MANGLES['markdown_underscores'](EARLIER_PH[1])}"
    arguments = json.dumps({"card": EARLIER_PH[2], "p": PH[0]})
    message = {"content": content, "tool_calls": [{"function": {"arguments": arguments}}]}
    body = json.dumps({"choices": [{"message": message}], "id": "chatcmpl-" + "a" * 24}).encode()
    restorer = PseudonymRestorer(NOW)
    first = json.loads(restore_json_body(body, restorer))["choices"][0]["message"]
    assert first["content"] == content  # the first run restores the map and collects the rest
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {
        "card": EARLIER_PH[2],
        "p": ORIG[0],
    }
    wanted = restorer.take_unresolved()
    assert wanted == set(EARLIER_PH)
    restorer.learn(vault_answer(VAULT, wanted), wanted)
    out = json.loads(restore_json_body(body, restorer))["choices"][0]["message"]
    assert out["content"] == f"Mail {EARLIER[0][1]} for {EARLIER[1][1]}"
    assert json.loads(out["tool_calls"][0]["function"]["arguments"]) == {"card": EARLIER[2][1], "p": ORIG[0]}


# --- SSE: the vault answers between two runs over one chunk ------------------------------------


def run_with_vault(dialect: str, chunks: list[bytes], vault: Mapping[str, str] | None = VAULT) -> bytes:
    """The exchange's loop: per chunk (the last one with the end of the stream), restore; if
    placeholders outside the map came up, ask the vault, roll back, restore the chunk again."""
    restorer = PseudonymRestorer(NOW)
    sse = SseRestorer(restorer, DIALECTS[dialect])
    out: list[bytes] = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        before = sse.checkpoint()
        piece = sse.feed(chunk) + (sse.finish() if last else b"")
        wanted = restorer.take_unresolved()
        if wanted:
            restorer.learn(vault_answer(vault, wanted), wanted)
            sse.rollback(before)
            piece = sse.feed(chunk) + (sse.finish() if last else b"")
            assert restorer.take_unresolved() == set()
        out.append(piece)
    return b"".join(out)


TEXT = (
    f"Hi {PH[0]}, I wrote to {MANGLES['no_brackets'](PH[2])} and {MANGLES['lowercase'](PH[3])}; "
    f"call {MANGLES['markdown_underscores'](PH[1])} or {MANGLES['json_escaped_brackets'](PH[4])}. "
    f"Look-alike: {LOOK_ALIKES[0]}. Card: {MANGLES['no_brackets'](PH[4])}"
)
EXPECTED = (
    f"Hi {ORIG[0]}, I wrote to {ORIG[2]} and {ORIG[3]}; call {ORIG[1]} or {ORIG[4]}. "
    f"Look-alike: {LOOK_ALIKES[0]}. Card: {ORIG[4]}"
)
ARGS = json.dumps({"to": PH[2], "cc": [PH[0]], "name": PH[3]}).replace("<", "\\u003c")
EXPECT = Expect(text=EXPECTED, args={"to": ORIG[2], "cc": [ORIG[0]], "name": ORIG[3]}, thinking=EXPECTED)
STREAMS = {dialect: build(dialect, TEXT, ARGS, TEXT) for dialect in CHECKS}


@pytest.mark.parametrize("dialect", list(STREAMS))
def test_sse_restores_earlier_turns_at_any_split(dialect: str) -> None:
    stream = STREAMS[dialect]
    whole = run_with_vault(dialect, [stream])
    CHECKS[dialect](whole, EXPECT)
    rng = random.Random(dialect)
    for _ in range(150):
        cuts = [rng.randrange(len(stream) + 1) for _ in range(rng.randrange(1, 40))]
        assert run_with_vault(dialect, splits(stream, cuts)) == whole
    assert run_with_vault(dialect, [stream[i : i + 7] for i in range(0, len(stream), 7)]) == whole


@pytest.mark.parametrize("dialect", list(STREAMS))
def test_sse_with_the_vault_down_restores_the_map_only(dialect: str) -> None:
    """The vault cannot answer: this request's values come back, earlier ones stay placeholders."""
    stream = STREAMS[dialect]
    down = run_with_vault(dialect, [stream[i : i + 50] for i in range(0, len(stream), 50)], None)
    text = restore_text(TEXT, None)
    assert ORIG[0] in text and ORIG[1] in text and MANGLES["no_brackets"](PH[2]) in text
    expect = Expect(text=text, args=json.loads(restore_text(ARGS, None, json_escaped=True)), thinking=text)
    CHECKS[dialect](down, expect)
    for _, value in EARLIER:
        assert json.dumps(value, ensure_ascii=False)[1:-1].encode() not in down


def test_a_rolled_back_chunk_leaves_no_trace() -> None:
    """A checkpoint taken mid-stream and rolled back gives the same output as never feeding."""
    stream = STREAMS["messages"]
    restorer = PseudonymRestorer(NOW)
    restorer.learn(VAULT, VAULT)
    reference = SseRestorer(restorer, DIALECTS["messages"])
    expected = reference.feed(stream) + reference.finish()
    sse = SseRestorer(restorer, DIALECTS["messages"])
    half = len(stream) // 2
    head = sse.feed(stream[:half])
    before = sse.checkpoint()
    sse.feed(stream[half:])
    sse.finish()
    sse.rollback(before)
    assert head + sse.feed(stream[half:]) + sse.finish() == expected


@settings(max_examples=example_count(60), deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=12), st.sampled_from(sorted(STREAMS)))
def test_property_sse_with_vault_equals_one_piece(cuts: list[int], dialect: str) -> None:
    stream = STREAMS[dialect]
    assert run_with_vault(dialect, splits(stream, cuts)) == run_with_vault(dialect, [stream])


def test_stream_restorer_holds_a_digest_until_it_is_whole() -> None:
    restorer = PseudonymRestorer(NOW)
    stream = StreamRestorer(restorer)
    placeholder = NOW_PH[0][1:-1]
    assert stream.feed("at " + placeholder[:-1]) == "at "
    assert stream.feed(placeholder[-1]) == ""  # complete, but a `>` (or another digit) may follow
    assert stream.feed(" ok") == ORIG[0] + " ok"


# --- the egress check reads consistent pseudonyms as text, without false alarms ------------------


def test_egress_passes_pseudonyms_of_a_declared_person() -> None:
    header = parse_subject_header(encode_subject_header({"subjects": [PERSON]}))
    subjects = compile_subjects(header)
    rng = random.Random(7)
    for _ in range(200):
        pmap = PseudonymMap(rng.randbytes(32))
        texts = [
            pmap.placeholder_for(f"SUBJECT1_{kind}", value)
            for kind, field in (
                ("NAME", "names"),
                ("EMAIL", "emails"),
                ("PHONE", "phones"),
                ("ADDRESS", "addresses"),
            )
            for value in PERSON[field]
        ]
        texts += [pmap.placeholder_for(label, f"v{rng.random()}") for label in PSEUDONYM_LABELS]
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": " ".join(texts)}]}).encode()
        assert check_body(body, DIALECTS["chat"], subjects, nonce=pmap.nonce) is None


def test_egress_reads_this_requests_own_pseudonyms_as_separators() -> None:
    # A declared name of hex letters: a pseudonym digest spells one of its forms now and
    # then. Find a key whose pseudonym does (between digits, where it reads as a word).
    subjects = compile_subjects(
        parse_subject_header(encode_subject_header({"subjects": [{"names": ["Abe Cafe"]}]}))
    )
    rng = random.Random(11)
    for _ in range(200_000):
        pmap = PseudonymMap(rng.randbytes(32))
        text = pmap.placeholder_for("EMAIL", "someone@example.org")
        if subjects.first_survivor(text) is not None:
            break
    else:
        raise AssertionError("no digest spelled a form of the name")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"mail {text}"}]}).encode()
    # Read as text (another request's pseudonym), it is refused; as this request's own, it is not.
    assert check_body(body, DIALECTS["chat"], subjects, nonce=pmap.nonce) is not None
    assert (
        check_body(body, DIALECTS["chat"], subjects, nonce=pmap.nonce, pseudonyms=pmap.pseudonyms()) is None
    )
    # Only the exact pseudonyms it wrote: the same shape with another digest is still read.
    other = PseudonymMap(b"k" * 32).placeholder_for("EMAIL", "someone@example.org")
    assert (
        check_body(body, DIALECTS["chat"], subjects, nonce=pmap.nonce, pseudonyms=frozenset({other}))
        is not None
    )
