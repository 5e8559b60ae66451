"""Media under `mask` end to end: screenshots rendered here go through Envoy, are masked
by real tesseract, and the test reads what the upstream received with tesseract again. Refusals for
what cannot be read; media-shaped tool inputs left alone; the OCR budget and Envoy's timeout.
"""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.media import image as ocr_image
from ext_proc.media.read import read_whole
from tests.support.e2e import PERSON, chat_body, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack, running_stack
from tests.support.receipts import record_for
from tests.support.screenshots import b64, data_url, encode, legible, render, styles

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
MASK = {"authorization": f"Bearer {KEYS['mask-media']}"}
PNG = encode(render(styles()[0]), "PNG")
JPEG = encode(render(styles()[1]), "JPEG")
TEXT = "Please read the attached screenshot about Marisol Quintero-Vance."


def subject(media: str | None = None) -> dict[str, str]:
    header: dict[str, Any] = {"ref": "media-case", "subjects": [PERSON]}
    if media:
        header["media"] = media
    return {"x-cordon-subject": encode_subject_header(header)}


def read_payload(payload: str) -> tuple[list[str], list[str]]:
    data, _, _ = ocr_image.decode_payload(payload)
    image, _ = ocr_image.open_image(data, None)
    words = read_whole(ocr_image.normalize(image), time.monotonic() + 60).words
    return legible([w.text for w in words])


def assert_masked(payload: str) -> None:
    secrets, ordinary = read_payload(payload)
    assert secrets == [] and len(ordinary) >= 5, (secrets, ordinary)


def chat_image(url: str) -> dict[str, Any]:
    return chat_body("x") | {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": TEXT}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ]
    }


def test_chat_image_is_masked_through_the_openai_sdk(stack: RunningStack, upstream: FakeUpstream) -> None:
    client = openai.OpenAI(
        base_url=stack.base_url + "/v1",
        api_key=KEYS["mask-media"],
        max_retries=0,
        timeout=60,
        default_headers=subject(),
    )
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=chat_image(data_url(PNG, "image/png"))["messages"]
    )
    raw.parse()
    sent = upstream.received[0].json()
    parts = sent["messages"][0]["content"]
    assert "Marisol" not in parts[0]["text"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1]["image_url"]["url"] != data_url(PNG, "image/png")
    assert_masked(parts[1]["image_url"]["url"])
    record = record_for(stack, "mask-media", raw.headers["x-cordon-receipt"])
    assert record["media"] == 1 and record["decision"] == "forwarded" and record["egress"] == "verified"


def test_responses_jpeg_is_masked(stack: RunningStack, upstream: FakeUpstream) -> None:
    body = {
        "model": "gpt-4o-mini",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": TEXT},
                    {"type": "input_image", "image_url": data_url(JPEG, "image/jpeg")},
                ],
            }
        ],
    }
    reply = request(
        stack.settings.listen_port, "POST", "/v1/responses", body, {**MASK, **subject()}, timeout=60
    )
    assert reply.status == 200, reply.body
    image = upstream.received[0].json()["input"][0]["content"][1]["image_url"]
    assert image.startswith("data:image/jpeg;base64,")
    assert_masked(image)


def test_anthropic_image_is_masked_through_the_sdk(stack: RunningStack, upstream: FakeUpstream) -> None:
    client = anthropic.Anthropic(
        base_url=stack.base_url,
        api_key=KEYS["mask-media"],
        max_retries=0,
        timeout=60,
        default_headers=subject(),
    )
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    # An image inside a tool result is media too.
    tool_result = {"type": "tool_result", "tool_use_id": "toolu_01", "content": [image]}
    client.messages.create(
        model="claude-sonnet-4-6",
        max_tokens=50,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": TEXT}, image]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_01", "name": "shot", "input": {}}],
            },
            {"role": "user", "content": [tool_result]},
        ],
    )
    sent = upstream.received[0].json()
    first = sent["messages"][0]["content"][1]["source"]
    nested = sent["messages"][2]["content"][0]["content"][0]["source"]
    for source in (first, nested):
        assert source["media_type"] == "image/png" and not source["data"].startswith("data:")
        assert_masked(source["data"])


def anthropic_user(block: dict[str, Any]) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}


REFUSED: list[tuple[str, str, dict[str, Any], str]] = [
    ("image by URL", CHAT, chat_image("https://img.example.invalid/shot.png"), "url"),
    (
        "audio",
        CHAT,
        chat_body("x")
        | {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
                    ],
                }
            ]
        },
        "audio",
    ),
    (
        "image by file id",
        "/v1/responses",
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-abc123"}]}],
        },
        "file id",
    ),
    (
        "pdf",
        "/v1/messages",
        anthropic_user(
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="},
            }
        ),
        "document",
    ),
    (
        "anthropic image by url",
        "/v1/messages",
        anthropic_user(
            {"type": "image", "source": {"type": "url", "url": "https://img.example.invalid/a.png"}}
        ),
        "url",
    ),
    ("image type lies", CHAT, chat_image(data_url(PNG, "image/jpeg")), "does not match"),
    (
        "not an image",
        CHAT,
        chat_image("data:image/png;base64," + b64(b"definitely not a png")),
        "could not be decoded",
    ),
]


@pytest.mark.parametrize(("case", "path", "body", "reason"), REFUSED, ids=[r[0] for r in REFUSED])
def test_what_cannot_be_read_is_refused(
    stack: RunningStack, upstream: FakeUpstream, case: str, path: str, body: dict[str, Any], reason: str
) -> None:
    reply = request(stack.settings.listen_port, "POST", path, body, {**MASK, **subject()}, timeout=60)
    assert reply.status == 422, reply.body
    error = reply.json()["error"]
    assert error["stage"] == "media" and reason in error["message"]
    assert upstream.received == []
    record = record_for(stack, "mask-media", reply.headers["x-cordon-receipt"])
    assert record["stage"] == "media" and record["media"] == 1


@pytest.mark.parametrize(
    ("tenant", "media", "outcome"),
    [
        ("allow-media", None, "allowed"),
        ("allow-media", "mask", "masked"),
        ("allow-media", "block", "refused"),
        ("mask-media", "allow", "masked"),  # the header cannot loosen the tenant's mask
        ("mask-media", "block", "refused"),
        (None, "mask", "refused"),  # the default tenant blocks; mask would loosen it
    ],
)
def test_the_stricter_of_tenant_and_header_wins(
    stack: RunningStack, upstream: FakeUpstream, tenant: str | None, media: str | None, outcome: str
) -> None:
    headers = {**({"authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}), **subject(media)}
    url = data_url(PNG, "image/png")
    reply = request(stack.settings.listen_port, "POST", CHAT, chat_image(url), headers, timeout=60)
    if outcome == "refused":
        assert reply.status == 422 and reply.json()["error"]["stage"] == "media"
        assert upstream.received == []
        return
    assert reply.status == 200
    sent = upstream.received[0].json()["messages"][0]["content"][1]["image_url"]["url"]
    if outcome == "allowed":
        assert sent == url
    else:
        assert sent != url
        assert_masked(sent)


def base64_spelling_initials() -> str:
    """The base64 of a PNG-looking file in which base64 happens to spell the declared person's
    initials between digits (about once per million characters): what a real screenshot does in
    one case out of a few."""
    compiled = compile_subjects(parse_subject_header(encode_subject_header({"subjects": [PERSON]})))
    rng = random.Random(11)
    while True:
        blob = base64.b64encode(b"\x89PNG\r\n\x1a\n" + rng.randbytes(150_000)).decode("ascii")
        if compiled.detect(blob + "!"):  # read as text (the "!" makes it no media file) it has a hit
            return blob


@pytest.mark.parametrize("kind", ["rendered", "spelling-initials"])
def test_media_shaped_tool_inputs_are_left_alone(
    stack: RunningStack, upstream: FakeUpstream, kind: str
) -> None:
    """Outside the schema positions an image-shaped object is text: not counted, not masked, and,
    carrying nothing to redact, forwarded byte for byte (whatever letters its base64 spells)."""
    if kind == "rendered":
        clean = b64(encode(render(styles()[0], ["A chart of parcel volumes"]), "PNG"))
    else:
        clean = base64_spelling_initials()
    shaped = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": clean}}
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "draw it"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_9", "name": "render", "input": shaped}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "done"}],
            },
        ],
    }
    chat = chat_body("x") | {
        "messages": [
            {"role": "user", "content": "draw it"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "render",
                            "arguments": json.dumps(
                                {"type": "image_url", "image_url": {"url": data_url(b"\x89PNG", "image/png")}}
                            ),
                        },
                    }
                ],
            },
        ]
    }
    port = stack.settings.listen_port
    for path, payload, pick in (
        ("/v1/messages", body, lambda sent: sent["messages"][1]["content"][0]["input"]),
        (CHAT, chat, lambda sent: sent["messages"][1]["tool_calls"][0]["function"]["arguments"]),
    ):
        upstream.clear()
        raw = json.dumps(payload, separators=(",", ":"))
        reply = request(port, "POST", path, raw, {**MASK, **subject()}, timeout=60)
        assert reply.status == 200, reply.body
        assert upstream.received[0].body == raw.encode()
        assert pick(upstream.received[0].json()) == pick(payload)
        assert record_for(stack, "mask-media", reply.headers["x-cordon-receipt"])["media"] == 0


def test_text_requests_do_not_wait_for_ocr(stack: RunningStack, upstream: FakeUpstream) -> None:
    """While two requests of four screenshots each are being masked, text requests are answered
    at once by the same workers."""
    images = [{"type": "image_url", "image_url": {"url": data_url(PNG, "image/png")}}] * 4
    heavy = chat_body("x") | {
        "messages": [{"role": "user", "content": [{"type": "text", "text": TEXT}, *images]}]
    }
    finished: list[float] = []

    def ocr_request() -> None:
        reply = request(stack.settings.listen_port, "POST", CHAT, heavy, {**MASK, **subject()}, timeout=120)
        assert reply.status == 200
        finished.append(time.monotonic())

    threads = [threading.Thread(target=ocr_request) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    latencies = []
    for _ in range(10):
        start = time.monotonic()
        assert request(stack.settings.listen_port, "POST", CHAT, chat_body("hello")).status == 200
        latencies.append(time.monotonic() - start)
    text_done = time.monotonic()
    for thread in threads:
        thread.join()
    assert len(finished) == 2
    assert text_done < min(finished), "the text requests waited for the OCR"
    assert max(latencies) < 1.0


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """Envoy waits 1 s per message by default here; one OCR thread; a roomy OCR budget."""
    tmp: Path = tmp_path_factory.mktemp("ocr-tight")
    with running_stack(
        tmp, workers=1, EXTPROC_MESSAGE_TIMEOUT="1", OCR_WORKERS="1", OCR_BUDGET_SECONDS="60"
    ) as s:
        yield s


@pytest.fixture(scope="module")
def starved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """One OCR thread and a 1 s OCR budget: sixteen screenshots take several times that."""
    tmp: Path = tmp_path_factory.mktemp("ocr-starved")
    with running_stack(tmp, workers=1, OCR_WORKERS="1", OCR_BUDGET_SECONDS="1") as s:
        yield s


def test_the_message_timeout_is_extended_while_ocr_runs(tight: RunningStack) -> None:
    """Six screenshots in one OCR thread take well over Envoy's 1 s message timeout (about 2.7 s
    here; more than 1 s on a machine 2.5 times faster): without the override Envoy would answer
    504. The body is also over 256 KB, so it is read in a thread."""
    images = [{"type": "image_url", "image_url": {"url": data_url(PNG, "image/png")}}] * 6
    filler = "routine words about parcels and schedules " * 8000
    body = chat_body("x") | {
        "messages": [{"role": "user", "content": [{"type": "text", "text": filler + TEXT}, *images]}]
    }
    tight.upstream.clear()
    start = time.monotonic()
    reply = request(tight.settings.listen_port, "POST", CHAT, body, {**MASK, **subject()}, timeout=60)
    elapsed = time.monotonic() - start
    assert reply.status == 200, reply.body[:300]
    assert elapsed > 1.0, "too fast to show the timeout extension; use more images"
    for part in tight.upstream.received[0].json()["messages"][0]["content"][1:]:
        assert_masked(part["image_url"]["url"])


def test_over_the_ocr_budget_is_refused_not_hung(starved: RunningStack) -> None:
    images = [{"type": "image_url", "image_url": {"url": data_url(PNG, "image/png")}}] * 16
    body = chat_body("x") | {
        "messages": [{"role": "user", "content": [{"type": "text", "text": TEXT}, *images]}]
    }
    starved.upstream.clear()
    start = time.monotonic()
    reply = request(starved.settings.listen_port, "POST", CHAT, body, {**MASK, **subject()}, timeout=60)
    assert reply.status == 503 and reply.json()["error"]["stage"] == "media"
    assert time.monotonic() - start < 10
    assert starved.upstream.received == []
    too_many = chat_body("x") | {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, *images, images[0]]}]
    }
    reply = request(starved.settings.listen_port, "POST", CHAT, too_many, {**MASK, **subject()}, timeout=60)
    assert reply.status == 422 and "more than 16 images" in reply.json()["error"]["message"]


def test_data_url_parameters_and_non_base64_payloads_are_read_as_text(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """Only `data:<type>;base64,` followed by base64 is payload. A parameter (a file name) or a
    payload that is not base64 is text a caller wrote: read, redacted, or refused; never skipped."""
    named = "data:image/png;name=Marisol Quintero-Vance passport.png;base64," + b64(PNG)
    not_base64 = "data:image/png;base64,Marisol Quintero-Vance mq@example.com"
    port = stack.settings.listen_port
    # Under mask, a part that is not a readable image is refused.
    reply = request(port, "POST", CHAT, chat_image(named), {**MASK, **subject()}, timeout=60)
    assert reply.status == 422 and reply.json()["error"]["stage"] == "media"
    # Under allow, both strings are walked as text: the upstream never sees the declared values.
    allow = {"authorization": f"Bearer {KEYS['allow-media']}", **subject()}
    for url in (named, not_base64):
        upstream.clear()
        reply = request(port, "POST", CHAT, chat_image(url), allow, timeout=60)
        if reply.status == 200:
            sent = upstream.received[0].text()
            assert "Marisol" not in sent and "Quintero" not in sent and "mq@example.com" not in sent
        else:
            assert reply.status == 422 and upstream.received == []
    # Without subjects, a catalog value in a parameter is redacted like any text.
    upstream.clear()
    leaky = "data:image/png;author=jane.roe@example.com;base64," + b64(PNG)
    assert request(port, "POST", CHAT, chat_image(leaky), timeout=60).status == 200
    assert "jane.roe@example.com" not in upstream.received[0].text()
