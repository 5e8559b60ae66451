"""Disguised values end to end, tried as an attacker would: real Envoy, ext_proc, Redis and the
fake upstream, on the default tenant.

Each disguise class (invisible and filler characters, look-alike letters and other scripts' digits,
typographic separators, escapes, text spelled in invisible tag characters) is sent inside an
ordinary sentence:

* with a declared subject: redacted where the text shows the value (the upstream gets the sentence
  with a placeholder where the value was, and the client gets the original back, exactly), or,
  where only a decoded view shows it, refused by the egress check (422) before the upstream is
  called;
* without one: catalog values redacted whole, the encoded span included, and restored exactly;
* in a model reply: the output gate under `deny` refuses it (JSON: 422; stream: the error event).

All values are invented. Assertions name case ids and labels, never the values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import regex

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import request
from tests.support.fake_upstream import ECHO_PREFIX, FakeUpstream
from tests.support.harness import KEYS, RunningStack, running_stack
from tests.support.receipts import records

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
PERSON = {
    "names": ["Odalys Prewitt-Kaur"],
    "emails": ["okaur@example.org"],
    "phones": ["+1 312-555-0146"],
    "ids": ["ZK7731904"],
}
HEADER = encode_subject_header({"ref": "disguise-01", "subjects": [PERSON]})
CARRIER = "Please keep this on record: {} (thanks)."
# This request's placeholders, and runs of them (a value may be replaced piece by piece).
_ONE = r"<[A-Z][A-Z0-9_]*_[0-9a-f]{8}_[0-9]+>"
PLACEHOLDERS = regex.compile(rf"{_ONE}(?:[\s\-.,]*{_ONE})*")


def shape(text: str) -> str:
    """`text` with each run of placeholders as `<>`."""
    return PLACEHOLDERS.sub("<>", text)


def send(
    port: int, content: str, *, subject: bool, key: str = "sk-test-no-tenant", stream: bool = False
) -> tuple[int, dict[str, str], bytes]:
    headers = {"authorization": f"Bearer {key}"}
    if subject:
        headers["x-cordon-subject"] = HEADER
    body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream"] = True
    reply = request(port, "POST", CHAT, body, headers)
    return reply.status, reply.headers, reply.body


def sent_content(upstream: FakeUpstream) -> str:
    assert len(upstream.received) == 1
    content = upstream.received[0].json()["messages"][0]["content"]
    assert isinstance(content, str)
    return content


def assert_redacted_and_restored(case: str, upstream: FakeUpstream, value: str, reply: bytes) -> None:
    """The upstream got the sentence with placeholders exactly where the value was; the client got
    the original back, character for character."""
    content = CARRIER.format(value)
    sent = sent_content(upstream)
    assert shape(sent) == CARRIER.format("<>"), f"{case}: the value was not replaced whole"
    answer = json.loads(reply)["choices"][0]["message"]["content"]
    assert answer == ECHO_PREFIX + content, f"{case}: the reply was not restored exactly"


# --- declared subjects: what the text shows is redacted

SHOWN = {
    # invisible and filler code points inside a name or between digits
    "hangul-fillers": "Oda\u115flys Pre\u1160witt-Ka\u3164ur",
    "halfwidth-filler": "Odal\uffa0ys Prewitt-Kaur",
    "format-characters": "Od\u2060al\u180ey\ufe0fs Pr\u034few\u061citt-Ka\u2066u\U000e0041r",
    "filler-between-digits": "312\u3164555\u31640146",
    # look-alike letters NFKC does not fold
    "small-capitals": "ᴏᴅᴀʟʏꜱ ᴘʀᴇᴡɪᴛᴛ-ᴋᴀᴜʀ",
    "modifier-letters": "ᴼᵈᵃˡʸˢ ᴾʳᵉʷᶦᵗᵗ-ᴷᵃᵘʳ",
    "cyrillic-homoglyphs": "Оdаlys Prеwitt-Kаur",
    "greek-homoglyphs": "Οdalys Ρrewitt-Κaur",
    "math-alphanumerics": "𝐎𝐝𝐚𝐥𝐲𝐬 𝐏𝐫𝐞𝐰𝐢𝐭𝐭-𝐊𝐚𝐮𝐫",
    "negative-circled": "🅞🅓🅐🅛🅨🅢 🅟🅡🅔🅦🅘🅣🅣-🅚🅐🅤🅡",
    "arabic-indic-digits": "٣١٢-٥٥٥-٠١٤٦",
    "devanagari-digits": "३१२ ५५५ ०१४६",
    # typographic separators
    "narrow-no-break": "312\u202f555\u202f0146",
    "no-break-and-thin": "312\u00a0555\u20090146",
    "figure-and-tab": "312\u2007555\t0146",
    "doubled-spaces": "312  555  0146",
    "en-dash-and-minus": "312\u2013555\u22120146",
    "non-breaking-hyphen": "ZK\u2011773\u20111904",
}


@pytest.mark.parametrize("case", list(SHOWN))
def test_a_declared_value_in_disguise_is_redacted(
    stack: RunningStack, upstream: FakeUpstream, case: str
) -> None:
    value = SHOWN[case]
    status, _, body = send(stack.settings.listen_port, CARRIER.format(value), subject=True)
    assert status == 200, f"{case}: {status}"
    assert_redacted_and_restored(case, upstream, value, body)


# --- declared subjects: what only a decoded view shows is refused (an email behind escapes is
# redacted by the catalog's decoded views before the check: see the catalog cases below)

ENCODED = {
    "percent-twice": "Odal%2579s",
    "entity-twice": "Odal&amp;#121;s",
    "js-braced": "Odal\\u{79}s",
    "octal": "ZK773\\061904",
    "eight-hex": "ZK773\\U00000031904",
    "named": "ZK773\\N{DIGIT ONE}904",
    "css": "ZK773\\31 904",
    "quoted-printable": "ZK773=31904",
    "unicode-escape": "Prew\\u0069tt",
    "tag-characters": "".join(chr(0xE0000 + ord(c)) for c in "ZK7731904"),
}


@pytest.mark.parametrize("case", list(ENCODED))
def test_a_declared_value_behind_escapes_is_refused(
    stack: RunningStack, upstream: FakeUpstream, case: str
) -> None:
    status, headers, body = send(stack.settings.listen_port, CARRIER.format(ENCODED[case]), subject=True)
    assert status == 422, f"{case}: {status}"
    error = json.loads(body)["error"]
    assert error["stage"] == "egress" and error["kind"].startswith("SUBJECT1_"), case
    assert headers.get("x-cordon-stage") == "egress"
    assert upstream.received == [], f"{case}: the upstream was called"


# --- the catalog (no subject declared): values redacted whole and restored exactly

CARD = "4929 5083 1764 2207"
IBAN = "DE44 5001 0517 5407 3249 31"
CATALOG = {
    "card-narrow-no-break": CARD.replace(" ", "\u202f"),
    "card-no-break": CARD.replace(" ", "\u00a0"),
    "card-thin": CARD.replace(" ", "\u2009"),
    "card-figure": CARD.replace(" ", "\u2007"),
    "card-tab": CARD.replace(" ", "\t"),
    "card-doubled": CARD.replace(" ", "  "),
    "card-en-dash": CARD.replace(" ", "\u2013"),
    "card-non-breaking-hyphen": CARD.replace(" ", "\u2011"),
    "card-minus": CARD.replace(" ", "\u2212"),
    "card-hangul-filler": CARD.replace(" ", "\u3164"),
    "card-zero-width": CARD.replace(" ", "\u200b"),
    "card-arabic-indic": CARD.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")),
    "card-devanagari": CARD.translate(str.maketrans("0123456789", "०१२३४५६७८९")),
    "card-math-digits": "𝟒𝟗𝟐𝟗 𝟓𝟎𝟖𝟑 𝟏𝟕𝟔𝟒 𝟐𝟐𝟎𝟕",
    "ssn-en-dash": "372\u201381\u20134406",
    "ssn-non-breaking-hyphen": "372\u201181\u20114406",
    "ssn-minus": "372\u221281\u22124406",
    "ssn-narrow-no-break": "372\u202f81\u202f4406",
    "phone-no-break": "+1\u00a0312\u00a0555\u00a00146",
    "phone-en-dash": "+1 312\u2013555\u20130146",
    "iban-no-break": IBAN.replace(" ", "\u00a0"),
    "iban-narrow-no-break": IBAN.replace(" ", "\u202f"),
    "email-small-capitals": "ᴛᴀᴍꜱɪɴ.rook@example.net",
    "email-cyrillic": "tаmsin.rооk@еxample.net",
    "email-math": "𝐭𝐚𝐦𝐬𝐢𝐧.rook@example.net",
    "email-small-at": "tamsin.rook\ufe6bexample.net",
    "email-grapheme-joiner": "tam\u034fsin.rook@exam\u034fple.net",
    "email-percent": "tamsin.rook%40example.net",
    "email-percent-twice": "tamsin.rook%2540example.net",
    "email-entity": "tamsin.rook&#64;example.net",
    "email-entity-twice": "tamsin.rook&amp;#64;example.net",
    "email-round-at": "tamsin.rook(at)example.net",
    "email-square-at": "tamsin.rook [at] example [dot] net",
    "email-js-braced": "tamsin.rook\\u{40}example.net",
    "email-octal": "tamsin.rook\\100example.net",
    "email-eight-hex": "tamsin.rook\\U00000040example.net",
    "email-named": "tamsin.rook\\N{COMMERCIAL AT}example.net",
    "email-css": "tamsin.rook\\40 example.net",
    "email-quoted-printable": "tamsin.rook=40example.net",
    "card-in-tag-characters": "".join(chr(0xE0000 + ord(c)) for c in CARD),
}


@pytest.mark.parametrize("case", list(CATALOG))
def test_a_catalog_value_in_disguise_is_redacted_whole(
    stack: RunningStack, upstream: FakeUpstream, case: str
) -> None:
    value = CATALOG[case]
    status, _, body = send(stack.settings.listen_port, CARRIER.format(value), subject=False)
    assert status == 200, f"{case}: {status}"
    assert_redacted_and_restored(case, upstream, value, body)


# --- a value set apart by what the canonical view removes or reads as a digit: an invisible
# character between it and a word (U+200B, the braille blank, a Hangul filler, an invisible
# separator), or a footnote mark after it (superscript, subscript, circled)

SET_APART = {
    # case: (before, value, after, declared)
    "zero-width-space-before-a-name": ("Dear\u200b", "Odalys Prewitt-Kaur", "", True),
    "braille-blanks-around-a-name": ("Dear\u2800", "Odalys Prewitt-Kaur", "\u2800called", True),
    "hangul-filler-before-a-surname": ("Mrs\u3164", "Prewitt-Kaur", "", True),
    "invisible-separator-before-an-id": ("id\u2063", "ZK7731904", "", True),
    "superscript-after-a-phone": ("call ", "312-555-0146", "\u00b9", True),
    "circled-digit-after-an-id": ("record ", "ZK7731904", "\u2460", True),
    "superscript-after-a-card": ("card ", CARD, "\u00b9", False),
    "fraction-after-an-email": ("", "tamsin.rook@example.net", "\u00bd", False),
    "subscript-after-an-iban": ("IBAN ", IBAN, "\u2081", False),
    "zero-width-space-before-an-ssn": ("ssn\u200b", "372-81-4406", "", False),
    # written against words of a script without spaces, or with a mark of another form
    "name-against-japanese": ("", "Odalys", "\u3055\u3093\u306b", True),
    "id-between-japanese": ("\u756a\u53f7", "ZK7731904", "\u3067\u3059", True),
    "phone-before-japanese": ("\u96fb\u8a71\u306f", "+1 312-555-0146", "\u3067\u3059", False),
    "iban-before-thai": ("", IBAN, "\u0e04\u0e23\u0e31\u0e1a", False),
    "superscript-letter-after-a-card": ("card ", CARD, "\u1d43", False),
    "subscript-phone-with-a-superscript-footnote": (
        "call ",
        "\u2083\u2081\u2082-\u2085\u2085\u2085-\u2080\u2081\u2084\u2086",
        "\u00b9",
        True,
    ),
    "modifier-letter-colon-before-a-name": ("name\u02d0", "Odalys", "", True),
    # a word of another script that ends in a look-alike of a Latin letter (Cyrillic `о`)
    "name-after-cyrillic": ("\u0441\u043f\u0430\u0441\u0438\u0431\u043e", "Odalys", "", True),
    "card-after-greek": ("\u039d\u03b1\u03b9", CARD, "", False),
}


@pytest.mark.parametrize("case", list(SET_APART))
def test_a_value_set_apart_by_an_invisible_character_or_a_footnote_is_redacted(
    stack: RunningStack, upstream: FakeUpstream, case: str
) -> None:
    before, value, after, declared = SET_APART[case]
    content = f"Please note {before}{value}{after} today."
    status, _, body = send(stack.settings.listen_port, content, subject=declared)
    assert status == 200, f"{case}: {status}"
    sent = sent_content(upstream)
    # A footnote mark may go with the value (a catalog kind of open length reads it as one more digit).
    replaced = shape(sent) in {f"Please note {before}<>{after} today.", f"Please note {before}<> today."}
    assert replaced, f"{case}: the value was not replaced whole"  # bools: no value is shown
    restored = json.loads(body)["choices"][0]["message"]["content"] == ECHO_PREFIX + content
    assert restored, f"{case}: the reply was not restored exactly"


@pytest.mark.parametrize(
    ("case", "header", "query"),
    [
        ("zero-width-space", "Dear\u200bOdalys Prewitt-Kaur", "Dear%E2%80%8BOdalys"),
        ("footnote", "call 312-555-0146\u00b9", "312-555-0146%C2%B9"),
    ],
    ids=["zero-width-space", "footnote"],
)
def test_a_value_set_apart_in_a_header_or_the_query_does_not_reach_the_upstream(
    stack: RunningStack, upstream: FakeUpstream, case: str, header: str, query: str
) -> None:
    headers = {
        "authorization": "Bearer sk-test-no-tenant",
        "x-cordon-subject": HEADER,
        # an HTTP header value travels as bytes; Latin-1 here carries the UTF-8 bytes as they are
        "x-note": header.encode().decode("latin-1"),
    }
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    reply = request(stack.settings.listen_port, "POST", f"{CHAT}?q={query}", body, headers)
    if reply.status == 422:
        assert upstream.received == [], case
        return
    assert reply.status == 200, f"{case}: {reply.status}"
    [received] = upstream.received
    seen = received.headers.get("x-note", "").encode("latin-1", "replace").decode("utf-8", "replace")
    header_hidden = "Odalys" not in seen and "0146" not in seen  # bools: no value is shown
    assert header_hidden, f"{case}: the header went as sent"
    query_hidden = "Odalys" not in received.path and "0146" not in received.path
    assert query_hidden, f"{case}: the query went as sent"


def test_ordinary_text_with_escapes_and_typography_passes_untouched(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    text = (
        'It is 100% sure: x = a & b; if (n == 10) { y = "line\\nnext"; } '
        "width=100 height=20 \\d{3} C:\\temp\\new \u2014 see (attached) \u00a0\u2013 caf\u00e9."
    )
    status, _, body = send(stack.settings.listen_port, text, subject=True)
    assert status == 200
    assert sent_content(upstream) == text
    assert json.loads(body)["choices"][0]["message"]["content"] == ECHO_PREFIX + text


ESCAPED_WORDS_HEADER = encode_subject_header({"ref": "disguise-02", "subjects": [{"names": ["Ana Ruiz"]}]})


def tool_call_body(arguments: dict[str, str]) -> dict[str, Any]:
    """A conversation with one tool call whose arguments are JSON written ASCII-only, as
    `json.dumps` writes it by default (`mañana` as `ma\\u00f1ana`), and the tool's answer alike."""
    return {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "user", "content": "What is on the agenda?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "agenda", "arguments": json.dumps(arguments)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(arguments)},
        ],
    }


def test_json_written_ascii_only_is_read_as_its_words(stack: RunningStack, upstream: FakeUpstream) -> None:
    """An escaped letter is part of its word: `ma\\u00f1ana` holds no `ana` for a declared Ana."""
    body = tool_call_body({"cuando": "mañana por la mañana", "nota": "Señora Bañana, información"})
    headers = {"authorization": "Bearer sk-test-no-tenant", "x-cordon-subject": ESCAPED_WORDS_HEADER}
    reply = request(stack.settings.listen_port, "POST", CHAT, body, headers)
    assert reply.status == 200, reply.body[:200]
    unchanged = upstream.received[0].json()["messages"] == body["messages"]
    assert unchanged  # a bool: the assertion shows no value


def test_the_declared_name_beside_escaped_words_is_still_caught(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    body = tool_call_body({"cuando": "mañana", "quien": "Ana Ruiz"})
    headers = {"authorization": "Bearer sk-test-no-tenant", "x-cordon-subject": ESCAPED_WORDS_HEADER}
    reply = request(stack.settings.listen_port, "POST", CHAT, body, headers)
    forwarded = upstream.received[0].body if upstream.received else b""
    assert reply.status in (200, 422)
    hidden = b"Ruiz" not in forwarded and b"Ana " not in forwarded
    assert hidden  # a bool: the assertion shows no value


# --- the output gate under deny


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("disguises"), tenants={"gate-deny": "outputGate: deny"}) as s:
        yield s


REPLIES = {
    "card-narrow-no-break": "Your card is " + CARD.replace(" ", "\u202f") + ".",
    "card-arabic-indic": "Your card is " + CARD.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")) + ".",
    "ssn-non-breaking-hyphen": "The SSN is 372\u201181\u20114406.",
    "iban-thin": "IBAN " + IBAN.replace(" ", "\u2009") + ".",
    "email-square-at": "Write to tamsin.rook [at] example [dot] net.",
    "email-percent": "Write to tamsin.rook%40example.net.",
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", list(REPLIES))
def test_the_gate_denies_a_disguised_value_in_a_reply(gated: RunningStack, case: str, stream: bool) -> None:
    gated.upstream.reset()
    gated.upstream.set_behaviour(reply=REPLIES[case], delta_chars=3)
    try:
        port, key = gated.settings.listen_port, KEYS["gate-deny"]
        status, headers, body = send(port, "What is on file?", subject=False, key=key, stream=stream)
    finally:
        gated.upstream.reset()
    text = body.decode("utf-8")
    if stream:
        assert status == 200  # the stream had started
        last = [event for event in text.split("\n\n") if event.strip()][-1]
        assert '"stage":"output"' in last, f"{case}: the stream was not ended by the gate"
    else:
        assert status == 422 and headers["x-cordon-stage"] == "output", f"{case}: {status}"
        assert json.loads(body)["error"]["stage"] == "output"
    assert REPLIES[case] not in text and REPLIES[case] not in json.dumps(text)


def test_the_gate_counts_one_card_in_two_renderings_once(gated: RunningStack) -> None:
    reply = f"Card {CARD}, again {CARD.replace(' ', chr(0x202F))}."
    gated.upstream.reset()
    gated.upstream.set_behaviour(reply=reply)
    try:
        status, headers, _ = send(gated.settings.listen_port, "What is on file?", subject=False)
    finally:
        gated.upstream.reset()
    assert status == 200  # the default tenant reports
    found = [r for _, r, _ in records(gated, "default") if r.get("exchange") == headers["x-cordon-receipt"]]
    assert len(found) == 1 and found[0]["counts"] == {"CREDIT_CARD": 1}
