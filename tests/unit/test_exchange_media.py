"""The tenant's `media` policy for requests without declared subjects, driven in-process: block,
mask (with a stand-in OCR pool that "reads" each image as a fixed text through the detectors it
is handed), and what the OCR is handed: the catalog with the policy's deny terms, allow list and
actions. The OCR itself is tested against tesseract in tests/integration/test_ocr.py.
"""

from __future__ import annotations

import io
import json
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ext_proc.cli import scan
from ext_proc.detect.catalog import regexes
from ext_proc.detect.catalog.engine import PRIORITY, PRIORITY_BASE, Catalog
from ext_proc.detect.catalog.extensions import CustomKind, Extensions
from ext_proc.exchange.masking import with_actions
from ext_proc.media.find import Declared, Detector, Hit, Tally, find_values
from ext_proc.media.image import MaskError, OcrTimeout
from ext_proc.media.mask import MaskResult
from ext_proc.media.pool import OcrPool
from ext_proc.media.read import Word
from ext_proc.policy.model import Policy
from ext_proc.transform.actions import KindBlocked
from tests.support.e2e import SAMPLES
from tests.support.fakes import Answer, EnvoyStream, FakeReceipts, chat, keyed, make_runtime

SECRET = b"receipt-secret"
CODENAME = "Project Kestrel"  # an invented deny term
SUPPORT = "helpdesk@corp-acme.example"  # an invented allowed address
EXTENSIONS = Extensions(deny=(CODENAME,), allow_values=(SUPPORT,), actions=(("CREDIT_CARD", "block"),))
TENANTS = {
    "block": keyed("block", "sk-block", media="block"),
    "mask": keyed("mask", "sk-mask", media="mask"),
    "mask-open": keyed("mask-open", "sk-mask-open", media="mask", fail_mode="open"),
    "mask-report": keyed("mask-report", "sk-mask-report", media="mask", report_only=True),
    "mask-extended": keyed("mask-extended", "sk-mask-extended", media="mask", extensions=EXTENSIONS),
    "plain": keyed("plain", "sk-plain"),
}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"  # a PNG's signature and header: real image bytes
MASKED = "data:image/png;base64,TUFTS0VE"  # what the stand-in pool writes back


class ReadingPool(OcrPool):
    """An OCR pool that reads every image as `text`: the detectors it is handed run over it (a
    blocked kind raises as in the OCR thread), each finding counts as a value painted, and the
    image comes back as MASKED. `error`: raised instead."""

    def __init__(self, text: str, error: Exception | None = None) -> None:
        super().__init__(1, 5.0, 2)
        self.text = text
        self.error = error
        self.handed: list[Sequence[Detector]] = []

    async def mask_all(
        self, items: Sequence[tuple[str, str | None]], detectors: Sequence[Detector], fuzzy: Declared | None
    ) -> list[tuple[str, MaskResult]]:
        self.handed.append(detectors)
        if self.error is not None:
            raise self.error
        results = []
        for _ in items:
            result = MaskResult(passes=1)
            for detect in detectors:
                for finding in detect(self.text):
                    result.values[finding.label] = result.values.get(finding.label, 0) + 1
                    result.masked_words += 1
            results.append((MASKED, result))
        return results


def stream(receipts: FakeReceipts, tenant: str, pool: OcrPool | None) -> EnvoyStream:
    runtime = make_runtime(*TENANTS.values(), receipts=receipts, secret=SECRET)
    runtime.ocr = pool
    s = EnvoyStream(runtime)
    answer = s.request_headers(headers=[("x-api-key", f"sk-{tenant}")])
    assert answer.phase == "request_headers"
    return s


def with_image(
    text: str, url: str = f"data:image/png;base64,{PNG}", kind: str = "image_url"
) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if kind == "input_audio":
        part = {"type": "input_audio", "input_audio": {"data": PNG, "format": "wav"}}
    return {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}, part]}],
    }


def last(answers: list[Answer]) -> Answer:
    assert answers[-1].phase in ("request_body", "immediate_response"), answers[-1].phase
    return answers[-1]


def refused(answer: Answer, status: int, stage: str) -> str:
    assert answer.refused and answer.status == status
    error = answer.json()["error"]
    assert error["stage"] == stage
    return str(error["message"])


# --- block, allow, and what mask cannot honour ----------------------------------------------------


def test_block_refuses_a_request_with_media_naming_the_count_and_the_key() -> None:
    receipts = FakeReceipts()
    body = with_image("see attached")
    body["messages"][0]["content"].append({"type": "file", "file": {"file_id": "file-abc123"}})
    message = refused(last(stream(receipts, "block", None).request_body(body)), 422, "media")
    assert message == "2 media part(s) in a request without declared subjects (media: block)"
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage, receipt.media) == ("refused", "media", 2)


def test_block_forwards_a_request_without_media() -> None:
    receipts = FakeReceipts()
    answer = last(stream(receipts, "block", None).request_body(chat(f"mail {SAMPLES['EMAIL']}")))
    assert answer.phase == "request_body" and answer.body is not None
    assert SAMPLES["EMAIL"].encode() not in answer.body


def test_the_default_forwards_an_image_unread() -> None:
    receipts = FakeReceipts()
    pool = ReadingPool(f"mail {SAMPLES['EMAIL']}")
    answer = last(stream(receipts, "plain", pool).request_body(with_image("hello")))
    assert (answer.phase, answer.body) == ("request_body", None)
    assert pool.handed == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (with_image("x", kind="input_audio"), "an audio part cannot be masked"),
        (with_image("x", url="https://img.example/a.png"), "an image given by url cannot be read here"),
        (with_image("x", url="data:image/png;base64,SGVsbG8gdGhlcmU="), "its payload is no image"),
    ],
    ids=["audio", "url", "text-payload"],
)
def test_mask_refuses_what_it_cannot_read(body: dict[str, Any], reason: str) -> None:
    receipts = FakeReceipts()
    pool = ReadingPool("nothing")
    message = refused(last(stream(receipts, "mask", pool).request_body(body)), 422, "media")
    assert reason in message and "media: mask" in message
    assert pool.handed == []


def test_mask_without_an_ocr_pool_is_refused() -> None:
    receipts = FakeReceipts()
    message = refused(last(stream(receipts, "mask", None).request_body(with_image("x"))), 422, "media")
    assert message == "media masking by OCR is not configured; the request was refused"


def test_mask_refuses_more_images_than_the_pool_takes() -> None:
    receipts = FakeReceipts()
    body = with_image("x")
    body["messages"][0]["content"] += [body["messages"][0]["content"][1]] * 2
    message = refused(last(stream(receipts, "mask", ReadingPool("x")).request_body(body)), 422, "media")
    assert message == "more than 2 images to mask in one request"


# --- mask ------------------------------------------------------------------------------------------


def test_mask_paints_the_image_redacts_the_text_and_counts_both_by_kind() -> None:
    receipts = FakeReceipts()
    pool = ReadingPool(f"card {SAMPLES['CREDIT_CARD']} mail {SAMPLES['EMAIL']}")
    answers = stream(receipts, "mask", pool).request_body(with_image(f"call {SAMPLES['PHONE']}"))
    assert answers[0].phase == "override_message_timeout"
    answer = last(answers)
    assert answer.phase == "request_body" and answer.body is not None
    sent = json.loads(answer.body)
    parts = sent["messages"][0]["content"]
    assert parts[1]["image_url"]["url"] == MASKED
    assert SAMPLES["PHONE"] not in parts[0]["text"] and "<PHONE_" in parts[0]["text"]
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.media) == ("forwarded", 1)
    assert dict(receipt.counts) == {"CREDIT_CARD": 1, "EMAIL": 1, "PHONE": 1}


def test_mask_forwards_an_image_without_identifiers_re_encoded() -> None:
    receipts = FakeReceipts()
    answer = last(
        stream(receipts, "mask", ReadingPool("Ticket about a parcel")).request_body(with_image("hi"))
    )
    assert answer.phase == "request_body" and answer.body is not None
    assert json.loads(answer.body)["messages"][0]["content"][1]["image_url"]["url"] == MASKED
    assert dict(receipts.receipts[0].counts) == {}


def test_the_ocr_is_handed_the_catalog_with_deny_allow_and_actions() -> None:
    receipts = FakeReceipts()
    pool = ReadingPool(f"{CODENAME} mail {SUPPORT} or {SAMPLES['EMAIL']}")
    answer = last(stream(receipts, "mask-extended", pool).request_body(with_image("hi")))
    assert answer.phase == "request_body"
    [detectors] = pool.handed
    assert len(detectors) == 1  # the catalog alone: no declared subjects, no fuzzy pattern
    assert dict(receipts.receipts[0].counts) == {"DENY_TERM": 1, "EMAIL": 1}  # the allowed one unpainted


def test_a_blocked_kind_in_an_image_refuses_naming_the_kind() -> None:
    receipts = FakeReceipts()
    pool = ReadingPool(f"card {SAMPLES['CREDIT_CARD']}")
    message = refused(
        last(stream(receipts, "mask-extended", pool).request_body(with_image("hi"))), 422, "policy"
    )
    assert "CREDIT_CARD" in message and "image" in message
    assert SAMPLES["CREDIT_CARD"] not in message
    assert receipts.receipts[0].stage == "policy"


@pytest.mark.parametrize(
    ("error", "status"),
    [(MaskError("an image holds text that could not be read with confidence"), 422), (OcrTimeout("t"), 503)],
    ids=["unreadable", "timeout"],
)
@pytest.mark.parametrize("tenant", ["mask", "mask-open"])
def test_an_image_the_ocr_cannot_mask_is_refused_whatever_fail_mode(
    tenant: str, error: Exception, status: int
) -> None:
    receipts = FakeReceipts()
    pool = ReadingPool("x", error=error)
    refused(last(stream(receipts, tenant, pool).request_body(with_image("hi"))), status, "media")
    assert receipts.receipts[0].decision == "refused"


def test_a_text_detection_failure_under_fail_mode_open_forwards_the_masked_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """failMode: open forwards the text unread, but never the original image: masking was done."""
    receipts = FakeReceipts()
    s = stream(receipts, "mask-open", ReadingPool("Ticket about a parcel"))
    monkeypatch.setattr(regexes, "REGEX_TIMEOUT", 1e-9)
    answer = last(s.request_body(with_image("1 2-3." * 50_000)))
    assert answer.phase == "request_body" and answer.body is not None
    assert json.loads(answer.body)["messages"][0]["content"][1]["image_url"]["url"] == MASKED
    assert s.exchange.record.gap == "detection"


def test_report_only_masks_for_the_record_and_forwards_the_original() -> None:
    receipts = FakeReceipts()
    pool = ReadingPool(f"mail {SAMPLES['EMAIL']}")
    answer = last(stream(receipts, "mask-report", pool).request_body(with_image("hi")))
    assert (answer.phase, answer.body) == ("request_body", None)
    [receipt] = receipts.receipts
    assert (receipt.decision, dict(receipt.counts)) == ("reported", {"EMAIL": 1})


def test_report_only_records_the_refusal_it_did_not_make() -> None:
    receipts = FakeReceipts()
    pool = ReadingPool("x", error=MaskError("unreadable"))
    answer = last(stream(receipts, "mask-report", pool).request_body(with_image("hi")))
    assert (answer.phase, answer.body) == ("request_body", None)
    assert (receipts.receipts[0].decision, receipts.receipts[0].stage) == ("reported", "media")


# --- what the OCR looks for, and how it counts ---------------------------------------------------


def words(*texts: str, y: int = 10, line: tuple[int, ...] = (0, 0, 0, 0, 0)) -> list[Word]:
    """Words side by side on one line (12 px per character, a space apart)."""
    out, x = [], 10
    for text in texts:
        right = x + 12 * len(text)
        quad = ((x, y), (right, y), (right, y + 20), (x, y + 20))
        out.append(Word(text, 95.0, tuple((float(a), float(b)) for a, b in quad), 20.0, line))
        x = right + 12
    return out


CATALOG = Catalog.for_sets(("pii", "pci", "secrets"), extensions=EXTENSIONS)


def test_the_catalog_finds_a_deny_term_and_honours_the_allow_list_in_read_words() -> None:
    read = words("Status", "of", "PROJECT", "kestrel", "for", SUPPORT)
    marked, hits = find_values(read, [with_actions(CATALOG, EXTENSIONS)], None)
    assert marked == {2, 3}
    assert {hit.label for hit in hits} == {"DENY_TERM"}


def test_an_allowed_kind_is_not_painted_and_a_blocked_one_raises() -> None:
    allowing = Extensions(actions=(("EMAIL", "allow"),))
    catalog = Catalog.for_sets(("pii", "pci", "secrets"), extensions=allowing)
    assert find_values(words("mail", SAMPLES["EMAIL"]), [with_actions(catalog, allowing)], None)[0] == set()
    with pytest.raises(KindBlocked) as info:
        find_values(words("card", *SAMPLES["CREDIT_CARD"].split()), [with_actions(CATALOG, EXTENSIONS)], None)
    assert info.value.kind == "CREDIT_CARD"


def test_a_value_read_twice_counts_once_and_two_values_twice() -> None:
    detect = [Catalog.for_sets(("pii", "pci", "secrets")).detect]
    first = words("mail", SAMPLES["EMAIL"], "and", "a@example.org")
    again = [Word(w.text, w.conf, w.quad, w.height, (1, 0, 0, 0, 0)) for w in first]  # another reading
    tally = Tally()
    tally.add(find_values(first, detect, None)[1])
    tally.add(find_values(first + again, detect, None)[1])
    assert tally.counts() == {"EMAIL": 2}


def test_overlapping_findings_of_two_kinds_are_one_value_of_the_better_ranked() -> None:
    """A misread that reads part of a card as a phone is the card, as overlaps resolve in text."""
    card = words("card", *SAMPLES["CREDIT_CARD"].split())
    rank = {kind: PRIORITY_BASE + index for index, kind in enumerate(PRIORITY)}
    tally = Tally()
    tally.add([Hit("PHONE", rank["PHONE"], tuple(w.quad for w in card[2:4]))])
    tally.add([Hit("CREDIT_CARD", rank["CREDIT_CARD"], tuple(w.quad for w in card[1:]))])
    below = words("mail", "x@example.org", y=60)[1]  # another value on the next line
    tally.add([Hit("EMAIL", rank["EMAIL"], (below.quad,))])
    assert tally.counts() == {"CREDIT_CARD": 1, "EMAIL": 1}


def test_a_policy_without_actions_hands_the_catalog_as_it_is() -> None:
    plain = Policy(tenant="t")
    assert with_actions(CATALOG, plain.extensions) == CATALOG.detect


# --- scan ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("media", "note"), [("mask", "runs no OCR"), ("block", "refuses (422)"), ("allow", None)]
)
def test_scan_says_it_cannot_show_what_the_media_policy_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], media: str, note: str | None
) -> None:
    path = tmp_path / "acme.yaml"
    path.write_text(f"tenant: acme\nmedia: {media}\n", encoding="utf-8")
    out = io.StringIO()
    args = Namespace(jsonl=False, sets=None, policy=str(path))
    assert scan.run(args, io.StringIO(f"mail {SAMPLES['EMAIL']}"), out) == 0
    assert [json.loads(line)["kind"] for line in out.getvalue().splitlines()] == ["EMAIL"]
    err = capsys.readouterr().err
    if note is None:
        assert err == ""
    else:
        assert err.startswith(f"scan: note: {path}: media: {media}: ") and note in err
        assert SAMPLES["EMAIL"] not in err


HOSTS = Extensions(
    custom_kinds=(CustomKind("HOST", r"[a-z]+\.corp\.acme\.internal"), CustomKind("EMP", r"EMP-\d{6}"))
)


@pytest.mark.parametrize(
    ("lines", "painted"),
    [
        ((("Host", "web.corp.acme.", "internal"),), {1, 2}),  # OCR read a space after a dot
        ((("Host", "web.corp", ".acme.internal"),), {1, 2}),
        ((("Badge", "EMP-"), ("482913", "today")), {1, 2}),  # an id wrapped onto the next line
        ((("Badge", "EMP-48"), ("2913", "today")), {1, 2}),  # cut inside its digits
        ((("Write", "to", "jane.roe@corp."), ("example", "now")), {2, 3}),  # an email wrapped
    ],
)
def test_a_value_split_by_ocr_or_by_a_line_wrap_is_painted(
    lines: tuple[tuple[str, ...], ...], painted: set[int]
) -> None:
    read = [w for n, texts in enumerate(lines) for w in words(*texts, y=10 + 30 * n, line=(0, 0, 0, n, 0))]
    catalog = Catalog.for_sets(("pii", "pci", "secrets"), extensions=HOSTS)
    assert find_values(read, [catalog.detect], None)[0] == painted
