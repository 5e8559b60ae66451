"""`media` for requests without declared subjects, end to end: real Envoy, workers, Redis, the OCR
pool and the fake upstream, over raw HTTP in Chat Completions, Responses and Anthropic Messages.

Under `media: mask` a screenshot holding an invented card and email goes out masked (what the
upstream received is read by an independent oracle, stronger than the masker: neither is
legible) and the receipt counts them by kind; `media: block` refuses any media; the default
forwards the image byte for byte; a kind under `actions: block` found in an image refuses the
request; an image without identifiers is forwarded; one the OCR cannot read is refused.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import regex
from PIL import Image, ImageDraw, ImageFont

from tests.support.e2e import Reply, request
from tests.support.harness import KEYS, RunningStack, running_stack
from tests.support.receipts import record_for
from tests.support.screenshots import cores_of, encode, oracle_words, render_shot, shot_set

pytestmark = pytest.mark.e2e

CARD = "4929 3817 5502 6642"  # invented, Luhn-valid
EMAIL = "r.tavish@example.org"  # invented, a reserved domain
# Label → the pieces of it that must not be legible (letters and digits, folded); a test names
# the label, never the value.
PIECES = {
    "card": tuple(CARD.split()),
    "email": ("rtavish", "tavish", "rtavishexampleorg"),
}
ORDINARY = ("ticket", "delayed", "parcel", "denver")
LINES = [
    "Support ticket 2291",
    f"Card {CARD} on file",
    f"Email: {EMAIL}",
    "Ticket about the delayed parcel in Denver",
]
CLEAN_LINES = [
    "Support ticket 2291",
    "Ticket about the delayed parcel in Denver",
    "Please answer before Friday",
]
TENANTS = {
    "media-mask": "media: mask",
    "media-block": "media: block",
    "media-mask-cards": "media: mask\nactions:\n  CREDIT_CARD: block",
}
DIALECTS = ("chat", "responses", "messages")
PROMPT = "What does this screenshot say?"


def screenshot(lines: list[str]) -> bytes:
    """A small ticket view, dark text on white, as a PNG."""
    font = ImageFont.load_default(size=20)
    width = 40 + max(int(font.getlength(line)) for line in lines)
    image = Image.new("RGB", (width, 30 + 36 * len(lines)), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((20, 15 + 36 * i), line, font=font, fill="#111111")
    return encode(image, "PNG")


def unreadable() -> tuple[bytes, str]:
    """A screenshot of the set that the OCR refuses: dim condensed text skewed by 20°, as a JPEG."""
    for shot in shot_set():
        if shot.name == "skewed-phone-dark-condensed22-20deg-jpeg":
            return encode(render_shot(shot), shot.fmt), "image/jpeg"
    pytest.skip("the screenshot set has no such shot on this machine (fonts)")


def legible(words: list[str]) -> list[str]:
    """The labels of PIECES still legible in a reading (a piece of six or more characters also
    with one character misread)."""
    text = cores_of(words)
    found = []
    for label, pieces in PIECES.items():
        for piece in pieces:
            if piece in text or (len(piece) >= 6 and regex.search(f"(?:{piece}){{e<=1}}", text)):
                found.append(label)
                break
    return found


def body_for(dialect: str, png: bytes, mime: str = "image/png") -> tuple[str, dict[str, Any]]:
    """(path, body) of a request carrying the screenshot in the dialect's image part."""
    url = f"data:{mime};base64," + base64.b64encode(png).decode("ascii")
    if dialect == "chat":
        content = [{"type": "text", "text": PROMPT}, {"type": "image_url", "image_url": {"url": url}}]
        return "/v1/chat/completions", {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": content}],
        }
    if dialect == "responses":
        content = [{"type": "input_text", "text": PROMPT}, {"type": "input_image", "image_url": url}]
        return "/v1/responses", {"model": "gpt-4o-mini", "input": [{"role": "user", "content": content}]}
    source = {"type": "base64", "media_type": mime, "data": base64.b64encode(png).decode("ascii")}
    content = [{"type": "text", "text": PROMPT}, {"type": "image", "source": source}]
    return "/v1/messages", {
        "model": "claude-sonnet-4-6",
        "max_tokens": 20,
        "messages": [{"role": "user", "content": content}],
    }


def sent_image(received: dict[str, Any], dialect: str) -> bytes:
    if dialect == "chat":
        url = received["messages"][0]["content"][1]["image_url"]["url"]
    elif dialect == "responses":
        url = received["input"][0]["content"][1]["image_url"]
    else:
        return base64.b64decode(received["messages"][0]["content"][1]["source"]["data"])
    return base64.b64decode(url.split(",", 1)[1])


def send(stack: RunningStack, tenant: str | None, dialect: str, png: bytes, mime: str = "image/png") -> Reply:
    path, body = body_for(dialect, png, mime)
    headers: dict[str, str] = {}
    if tenant is not None:
        headers = (
            {"x-api-key": KEYS[tenant]}
            if dialect == "messages"
            else {"authorization": f"Bearer {KEYS[tenant]}"}
        )
    return request(stack.settings.listen_port, "POST", path, json.dumps(body), headers, timeout=120)


def refusal(reply: Reply, status: int, stage: str) -> str:
    assert reply.status == status, reply.status
    error = reply.json()["error"]
    assert error["stage"] == stage, error["stage"]
    message = str(error["message"])
    assert legible([message]) == [], "the refusal names a value"
    return message


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("media-catalog"), tenants=TENANTS) as s:
        yield s


@pytest.fixture
def fresh(stack: RunningStack) -> RunningStack:
    stack.upstream.reset()
    return stack


ORIGINAL = screenshot(LINES)
READINGS: dict[str, list[str]] = {}  # sha256 of an image → the oracle's words (one reading each)


def oracle(image: bytes) -> list[str]:
    digest = hashlib.sha256(image).hexdigest()
    if digest not in READINGS:
        READINGS[digest] = oracle_words(image, 0.0)
    return READINGS[digest]


def test_the_screenshot_shows_the_card_and_the_email() -> None:
    """The oracle reads both in the original: their absence afterwards is the masking's doing."""
    assert legible(oracle(ORIGINAL)) == ["card", "email"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mask_paints_the_card_and_the_email_and_counts_them_by_kind(
    fresh: RunningStack, dialect: str
) -> None:
    reply = send(fresh, "media-mask", dialect, ORIGINAL)
    assert reply.status == 200, reply.body[:300]
    [received] = fresh.upstream.received
    image = sent_image(received.json(), dialect)
    assert image != ORIGINAL, "the image went upstream as it came"
    with Image.open(io.BytesIO(image)) as decoded:
        decoded.load()
    words = oracle(image)
    assert legible(words) == [], f"legible upstream: {legible(words)}"
    kept = [word for word in ORDINARY if word in cores_of(words)]
    assert len(kept) >= 3, f"only {kept} of the ordinary words left"
    record = record_for(fresh, "media-mask", reply.headers.get("x-cordon-receipt"))
    assert (record["decision"], record["media"]) == ("forwarded", 1)
    assert record["counts"] == {"CREDIT_CARD": 1, "EMAIL": 1}


def test_block_refuses_any_media_before_the_upstream(fresh: RunningStack) -> None:
    reply = send(fresh, "media-block", "chat", ORIGINAL)
    message = refusal(reply, 422, "media")
    assert message == "1 media part(s) in a request without declared subjects (media: block)"
    assert fresh.upstream.received == [], "the upstream was called"
    record = record_for(fresh, "media-block", reply.headers.get("x-cordon-receipt"))
    assert (record["decision"], record["stage"]) == ("refused", "media")


@pytest.mark.parametrize("dialect", ["chat", "messages"])
def test_the_default_forwards_the_image_byte_for_byte(fresh: RunningStack, dialect: str) -> None:
    reply = send(fresh, None, dialect, ORIGINAL)
    assert reply.status == 200
    [received] = fresh.upstream.received
    _, body = body_for(dialect, ORIGINAL)
    assert received.body == json.dumps(body).encode(), "the default tenant changed the request"
    assert sent_image(received.json(), dialect) == ORIGINAL


def test_a_blocked_kind_in_an_image_refuses_the_request(fresh: RunningStack) -> None:
    reply = send(fresh, "media-mask-cards", "responses", ORIGINAL)
    message = refusal(reply, 422, "policy")
    assert "CREDIT_CARD" in message and "image" in message
    assert fresh.upstream.received == [], "the upstream was called"


def test_an_image_without_identifiers_is_forwarded(fresh: RunningStack) -> None:
    clean = screenshot(CLEAN_LINES)
    reply = send(fresh, "media-mask", "messages", clean)
    assert reply.status == 200
    [received] = fresh.upstream.received
    with Image.open(io.BytesIO(sent_image(received.json(), "messages"))) as decoded:
        assert decoded.size == Image.open(io.BytesIO(clean)).size
    record = record_for(fresh, "media-mask", reply.headers.get("x-cordon-receipt"))
    assert (record["decision"], record.get("counts", {})) == ("forwarded", {})


def test_an_image_the_ocr_cannot_read_is_refused(fresh: RunningStack) -> None:
    image, mime = unreadable()
    reply = send(fresh, "media-mask", "chat", image, mime)
    message = refusal(reply, 422, "media")
    assert "could not be read with confidence" in message
    assert fresh.upstream.received == [], "the upstream was called"


def test_x_tenant_may_tighten_media_but_not_loosen_it(fresh: RunningStack) -> None:
    """allow < mask < block: the default's key may name the blocking tenant (and is refused for
    the image), a masking tenant's key may not name the default."""
    path, body = body_for("chat", ORIGINAL)
    port = fresh.settings.listen_port
    tightened = request(port, "POST", path, json.dumps(body), {"x-tenant": "media-block"}, timeout=60)
    assert "1 media part(s)" in refusal(tightened, 422, "media")
    key = {"authorization": f"Bearer {KEYS['media-mask']}", "x-tenant": "default"}
    loosened = request(port, "POST", path, json.dumps(body), key, timeout=60)
    assert loosened.status == 403 and "media" in loosened.json()["error"]["message"]
    assert fresh.upstream.received == []
