"""Declared identifiers written through words, end to end through real Envoy: dates in other
languages, long English forms and Roman-numeral months; a phone or id whose digit groups are joined
by words or single letters; a street line without its direction or suffix.

Each rendering is sent in all three APIs (Chat Completions, Responses, Anthropic Messages) with the
official SDKs: it must arrive at the upstream redacted (the client gets it back restored), and where
redaction is off for the field (a system prompt under `redactSystem: false`) the egress check
refuses the request before the upstream is called. Ordinary text with the same numbers in prose,
other dates and other streets passes untouched. The person is invented.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import chat_body, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack

pytestmark = pytest.mark.e2e

ECHO = "You said: "
PERSON = {
    "names": ["Odalys Ferreira-Quist"],
    "phones": ["+1 312-555-0146"],
    "dates": ["1979-03-03"],
    "ids": ["K7730519"],
    "addresses": ["2750 North Ravensworth Boulevard", "902 Maple Street", "455 Kettering Ave NW"],
}
HEADER = encode_subject_header({"ref": "renderings-7", "subjects": [PERSON]})

# label → (rendering, tells). A tell is a run of letters and digits that must not appear in any
# string the upstream receives (compared with separators removed); "#" before it means the digits
# of a string with everything else removed (a phone split by words).
RENDERINGS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "dates": {
        "de": ("Geboren am 3. März 1979 in Bremen", ("1979",)),
        "fr": ("née le 3 mars 1979 à Lyon", ("1979",)),
        "es": ("nació el 3 de marzo de 1979", ("1979",)),
        "it": ("nata il 3 marzo 1979", ("1979",)),
        "pt": ("nasceu em 3 de março de 1979", ("1979",)),
        "nl": ("geboren op 3 maart 1979", ("1979",)),
        "en-the-of": ("born on the 3rd of March, 1979", ("1979",)),
        "en-month-the": ("born March the 3rd, 1979", ("1979",)),
        "en-ordinal-word": ("born the third of March 1979", ("1979",)),
        "roman": ("geb. 3.III.1979", ("1979",)),
    },
    "numbers": {
        "area-code": ("area code 312, then 555 and 0146", ("#3125550146", "0146")),
        "letters": ("3a1b2c5d5e5f0g1h4i6", ("#3125550146",)),
        "dashes-as-words": ("312 dash 555 dash 0146", ("#3125550146", "0146")),
        "followed-by": ("312 followed by 555, followed by 0146", ("#3125550146", "0146")),
        "id": ("file K 773 then 0519", ("#7730519", "0519")),
    },
    "addresses": {
        "no-direction": ("lives at 2750 Ravensworth Blvd", ("ravensworth",)),
        "no-suffix": ("lives at 2750 North Ravensworth", ("ravensworth",)),
        "neither": ("lives at 2750 Ravensworth", ("ravensworth",)),
        "common-name": ("lives at 902 Maple, by the park", ("902maple", "902")),
        "trailing-direction": ("office at 455 Kettering NW", ("kettering",)),
    },
}
# Between two renderings: a word of 6+ letters and no digit, so that nothing joins across them.
JOIN = "\n\nParagraph.\n\n"
ORDINARY = (
    "I have 312 apples and 555 pears, call 0146 tomorrow. Build 3.1.2 shipped 773 orders. "
    "Born 4 mars 1979; the 3rd of April 1979; 2751 Ravensworth Ave; 902 Mapleton Road; 3 de marzo."
)


def text_of(family: str) -> str:
    return JOIN.join(rendering for rendering, _ in RENDERINGS[family].values())


def strings_in(body: bytes) -> list[str]:
    """Every string and key of a JSON body, and of JSON carried inside its strings."""
    found: list[str] = []

    def visit(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
            try:
                inner = json.loads(value)
            except ValueError:
                return
            if isinstance(inner, (dict, list)):
                visit(inner)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(key)
                visit(item)
        elif isinstance(value, list):
            for item in value:
                visit(item)

    visit(json.loads(body))
    return found


def leaked_labels(body: bytes, family: str) -> list[str]:
    """The labels of the renderings whose tells reached the upstream (never the values)."""
    strings = strings_in(body)
    alnum = ["".join(c for c in fold(s) if c.isalnum()) for s in strings]
    digits = ["".join(c for c in fold(s) if c.isdigit()) for s in strings]
    out = []
    for label, (_, tells) in RENDERINGS[family].items():
        for tell in tells:
            haystack = digits if tell.startswith("#") else alnum
            if any(tell.lstrip("#") in h for h in haystack):
                out.append(label)
                break
    return out


def oa(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.base_url + "/v1",
        api_key="sk-test-default",
        max_retries=0,
        timeout=20,
        default_headers={"x-cordon-subject": HEADER},
    )


def an(stack: RunningStack) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=stack.base_url,
        api_key="sk-ant-test-default",
        max_retries=0,
        timeout=20,
        default_headers={"x-cordon-subject": HEADER},
    )


def chat(stack: RunningStack, text: str) -> str:
    reply = oa(stack).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}]
    )
    return reply.choices[0].message.content or ""


def chat_streamed(stack: RunningStack, text: str) -> str:
    stream = oa(stack).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}], stream=True
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def responses(stack: RunningStack, text: str) -> str:
    return oa(stack).responses.create(model="gpt-4o-mini", input=text).output_text


def messages(stack: RunningStack, text: str) -> str:
    reply = an(stack).messages.create(
        model="claude-sonnet-4-6", max_tokens=256, messages=[{"role": "user", "content": text}]
    )
    block = reply.content[0]
    assert block.type == "text"
    return block.text


APIS: dict[str, Callable[[RunningStack, str], str]] = {
    "chat": chat,
    "chat-streamed": chat_streamed,
    "responses": responses,
    "messages": messages,
}


@pytest.mark.parametrize("family", list(RENDERINGS))
@pytest.mark.parametrize("api", list(APIS))
def test_renderings_arrive_redacted_and_come_back_restored(
    stack: RunningStack, upstream: FakeUpstream, api: str, family: str
) -> None:
    text = text_of(family)
    answer = APIS[api](stack, text)
    assert len(upstream.received) == 1
    assert leaked_labels(upstream.received[0].body, family) == []
    assert "<SUBJECT1_" in upstream.received[0].text()
    restored = answer == ECHO + text
    assert restored, f"{api}/{family}: the reply is not the restored original"


SYSTEM_POSITIONS: dict[str, Callable[[str], tuple[str, dict[str, Any]]]] = {
    "chat": lambda system: ("/v1/chat/completions", chat_body("hello", messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "hello"}])),
    "responses": lambda system: ("/v1/responses", {
        "model": "gpt-4o-mini", "instructions": system, "input": "hello"}),
    "messages": lambda system: ("/v1/messages", {
        "model": "claude-sonnet-4-6", "max_tokens": 64, "system": system,
        "messages": [{"role": "user", "content": "hello"}]}),
}  # fmt: skip


@pytest.mark.parametrize("api", list(SYSTEM_POSITIONS))
def test_renderings_left_by_policy_are_refused_by_the_egress_check(
    stack: RunningStack, upstream: FakeUpstream, api: str
) -> None:
    """A tenant that does not redact system prompts: each rendering there is read by the egress
    check, and the request is refused before the upstream is called."""
    headers = {"x-cordon-subject": HEADER, "authorization": f"Bearer {KEYS['nosystem']}"}
    for family, renderings in RENDERINGS.items():
        for label, (rendering, _) in renderings.items():
            path, body = SYSTEM_POSITIONS[api](f"Customer note: {rendering}.")
            reply = request(stack.settings.listen_port, "POST", path, body, headers)
            refused = reply.status == 422 and reply.json()["error"]["stage"] == "egress"
            assert refused, f"{api}/{family}/{label}: status {reply.status}"
            kind = reply.json()["error"]["kind"]
            assert kind.startswith("SUBJECT1_"), f"{api}/{family}/{label}"
            echoed = any(t.lstrip("#") in reply.body.decode().lower() for t in renderings[label][1])
            assert not echoed, f"{api}/{family}/{label}: the refusal echoes the value"
    assert upstream.received == []


@pytest.mark.parametrize("api", list(SYSTEM_POSITIONS))
def test_ordinary_numbers_dates_and_streets_pass_untouched(
    stack: RunningStack, upstream: FakeUpstream, api: str
) -> None:
    """The declared phone's own digit groups in prose, versions, counts, other dates and other
    streets: neither redacted nor refused, even where only the egress check reads them."""
    headers = {"x-cordon-subject": HEADER, "authorization": f"Bearer {KEYS['nosystem']}"}
    path, body = SYSTEM_POSITIONS[api](ORDINARY)
    reply = request(stack.settings.listen_port, "POST", path, body, headers)
    assert reply.status == 200, f"{api}: status {reply.status}"
    untouched = ORDINARY in strings_in(upstream.received[0].body)
    assert untouched, f"{api}: the system prompt was changed"
    user = {"x-cordon-subject": HEADER}
    path, body = SYSTEM_POSITIONS[api]("Be brief.")
    if api == "responses":
        body["input"] = ORDINARY
    else:
        body["messages"] = [{"role": "user", "content": ORDINARY}]
    reply = request(stack.settings.listen_port, "POST", path, body, user)
    assert reply.status == 200, f"{api}: status {reply.status}"
    untouched = ORDINARY in strings_in(upstream.received[1].body)
    assert untouched, f"{api}: the user message was changed"
