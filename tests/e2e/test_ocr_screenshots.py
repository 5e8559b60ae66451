"""Screenshots that are turned, skewed, dark or faint, masked end to end: through Envoy to the OCR
pool and on to the fake upstream, in Chat Completions (the `openai` SDK) and Anthropic Messages
(the `anthropic` SDK).

Each screenshot shows a declared identifier (tests/support/screenshots.py `shot_set`). What the
upstream received is read by the test's own oracle, stronger than the masker's reading (turned
back by the known angle, 2x and 3x, a contrast window, both polarities): the identifier must not
be legible there. Or the request is refused (422 `media`, a reason and no value) and the upstream
never called. An upright screenshot must be masked, and one without an identifier forwarded.
"""

from __future__ import annotations

import base64
import collections
from typing import Any

import anthropic
import openai
import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack
from tests.support.screenshots import (
    IDENTIFIERS,
    SHOT_ORDINARY,
    SHOT_PERSON,
    Shot,
    cores_of,
    data_url,
    encode,
    oracle_words,
    render_shot,
    shot_leaks,
    shot_set,
)

pytestmark = pytest.mark.e2e

HEADERS = {"x-cordon-subject": encode_subject_header({"ref": "shots", "subjects": [SHOT_PERSON]})}
MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}
# (dialect, class) → outcome → count, reported by the last test.
SPLIT: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)


def pick(kind: str, theme: str, angle: float | None = None) -> Shot:
    """The first shot of the larger set of this class and theme (and angle)."""
    for shot in shot_set(large=True):
        if (shot.kind, shot.theme) == (kind, theme) and angle in (None, shot.angle):
            return shot
    raise LookupError(f"no shot {kind}/{theme}/{angle}")


CASES = [
    pick("right-angle", "light", 90.0),
    pick("right-angle", "dark", 180.0),
    pick("diagonal", "light", 45.0),
    pick("skewed", "dark", 20.0),
    pick("skewed", "light-faint", -8.0),
    pick("low-contrast", "dark-dim"),
    pick("low-contrast", "light-faint"),
]
MUST_MASK = [pick("upright", "dark"), pick("upright", "light")]
CLEAN = [pick("no-identifier", "dark-dim", 90.0), pick("no-identifier", "dark", 0.0)]


def send(stack: RunningStack, dialect: str, png: bytes, mime: str) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of a request carrying the screenshot, sent with the dialect's SDK."""
    try:
        if dialect == "chat":
            client = openai.OpenAI(
                base_url=stack.base_url + "/v1",
                api_key=KEYS["mask-media"],
                max_retries=0,
                timeout=120,
                default_headers=HEADERS,
            )
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Please read the attached screenshot."},
                            {"type": "image_url", "image_url": {"url": data_url(png, mime)}},
                        ],
                    }
                ],
            )
        else:
            messages = anthropic.Anthropic(
                base_url=stack.base_url,
                api_key=KEYS["mask-media"],
                max_retries=0,
                timeout=120,
                default_headers=HEADERS,
            ).messages
            image = {"type": "base64", "media_type": mime, "data": base64.b64encode(png).decode("ascii")}
            messages.create(
                model="claude-sonnet-4-6",
                max_tokens=20,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Please read the attached screenshot."},
                            {"type": "image", "source": image},
                        ],
                    }
                ],
            )
    except (openai.APIStatusError, anthropic.APIStatusError) as error:
        return error.status_code, error.response.json()
    return 200, {}


def sent_image(upstream: FakeUpstream, dialect: str) -> bytes:
    body = upstream.received[0].json()
    part = body["messages"][0]["content"][1]
    if dialect == "chat":
        return base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
    return base64.b64decode(part["source"]["data"])


def outcome(stack: RunningStack, upstream: FakeUpstream, dialect: str, shot: Shot) -> str:
    """'masked', 'forwarded' or 'refused', after checking what went out or why it did not."""
    original = encode(render_shot(shot), shot.fmt)
    status, body = send(stack, dialect, original, MIME[shot.fmt])
    if status == 422:
        error = body["error"]
        assert error["stage"] == "media" and "could not be read" in error["message"], shot.name
        assert shot.identifier is None or not shot_leaks([error["message"]], shot.identifier)
        assert upstream.received == [], f"{shot.name}: refused, yet the upstream was called"
        return "refused"
    assert status == 200, (shot.name, status)
    image = sent_image(upstream, dialect)
    assert image != original, f"{shot.name}: the image went out as it came (not re-encoded)"
    words = oracle_words(image, shot.angle)
    if shot.identifier is not None:
        assert not shot_leaks(words, shot.identifier), f"{shot.name}: the {shot.identifier} went out legible"
    ordinary = [word for word in SHOT_ORDINARY if word in cores_of(words)]
    assert len(ordinary) >= 3, f"{shot.name}: {len(ordinary)} ordinary words left"
    text = upstream.received[0].json()["messages"][0]["content"][0]["text"]
    assert not any(piece in cores_of([text]) for _, pieces in IDENTIFIERS.values() for piece in pieces)
    return "masked" if shot.identifier is not None else "forwarded"


@pytest.mark.parametrize("dialect", ["chat", "messages"])
@pytest.mark.parametrize("shot", CASES, ids=lambda s: s.name)
def test_a_turned_skewed_dark_or_faint_screenshot_is_masked_or_refused(
    stack: RunningStack, upstream: FakeUpstream, dialect: str, shot: Shot
) -> None:
    result = outcome(stack, upstream, dialect, shot)
    SPLIT[(dialect, shot.kind)][result] += 1
    assert result in ("masked", "refused")


@pytest.mark.parametrize("dialect", ["chat", "messages"])
@pytest.mark.parametrize("shot", MUST_MASK, ids=lambda s: s.name)
def test_an_upright_screenshot_is_masked_not_refused(
    stack: RunningStack, upstream: FakeUpstream, dialect: str, shot: Shot
) -> None:
    assert outcome(stack, upstream, dialect, shot) == "masked"


@pytest.mark.parametrize("dialect", ["chat", "messages"])
@pytest.mark.parametrize("shot", CLEAN, ids=lambda s: s.name)
def test_a_screenshot_without_an_identifier_is_forwarded(
    stack: RunningStack, upstream: FakeUpstream, dialect: str, shot: Shot
) -> None:
    assert outcome(stack, upstream, dialect, shot) == "forwarded"


def test_the_split() -> None:
    """What the turned, skewed, dark and faint screenshots came to, per dialect and class (run
    with `-s` to see it); refusing them all would not be masking."""
    print("\nend to end: dialect, class, masked / refused")
    for (dialect, kind), counts in sorted(SPLIT.items()):
        print(f"  {dialect:<9} {kind:<13} {counts['masked']} / {counts['refused']}")
    masked = sum(counts["masked"] for counts in SPLIT.values())
    assert not SPLIT or masked >= sum(sum(counts.values()) for counts in SPLIT.values()) // 2
