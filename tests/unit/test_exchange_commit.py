"""The commit, driven in-process: nothing is released before its receipt, its vault entries and
its surrogates are written; a store that fails refuses the request (or, for the receipt of a
request without subjects under failMode: open, forwards it with the gap recorded).
"""

from __future__ import annotations

import json

import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from ext_proc.storage.vault import SurrogateExhausted
from ext_proc.transform.surrogates import candidate, family_of
from tests.support.e2e import PERSON, SAMPLES
from tests.support.fakes import (
    Answer,
    EnvoyStream,
    FakeReceipts,
    FakeVault,
    chat,
    chat_reply,
    keyed,
    make_runtime,
)

EMAIL, PHONE = SAMPLES["EMAIL"], SAMPLES["PHONE"]
ACME = keyed("acme", "sk-acme")
OPEN = keyed("open", "sk-open", fail_mode="open")
PSEUDONYMS = keyed("pseudo", "sk-pseudo", consistent_pseudonyms=True, vault_ttl_seconds=600)
SURROGATES = keyed("surro", "sk-surro", mode="surrogate")
KEYS = {"acme": "sk-acme", "open": "sk-open", "pseudo": "sk-pseudo", "surro": "sk-surro"}
SUBJECT = encode_subject_header({"ref": "case-7", "subjects": [PERSON]})


class Stores:
    """The fakes of one test, calling into one journal (which store was called when)."""

    def __init__(self) -> None:
        self.journal: list[str] = []
        self.receipts = FakeReceipts(self.journal)
        self.vault = FakeVault(journal=self.journal)

    def stream(self, tenant: str = "acme", *extra: tuple[str, str]) -> EnvoyStream:
        runtime = make_runtime(ACME, OPEN, PSEUDONYMS, SURROGATES, receipts=self.receipts, vault=self.vault)
        s = EnvoyStream(runtime)
        answer = s.request_headers(headers=[("x-api-key", KEYS[tenant]), *extra])
        assert answer.phase == "request_headers" and not answer.refused
        return s


def send(s: EnvoyStream, body: object) -> Answer:
    [answer] = s.request_body(body)
    return answer


def refused_with(answer: Answer, status: int, stage: str, message: str) -> None:
    assert answer.refused and answer.status == status
    detail = answer.json()["error"]
    assert (detail["stage"], detail["message"]) == (stage, message)


# --- receipts -------------------------------------------------------------------------------------


def test_a_refusal_carries_the_hash_of_its_receipt() -> None:
    stores = Stores()
    answer = send(stores.stream(), b"{not json")
    assert answer.refused
    [receipt] = stores.receipts.receipts
    # The hash in the answer is the chain's: the receipt was appended before the answer was built.
    assert answer.headers["x-cordon-receipt"] == receipt.hash
    assert (receipt.decision, receipt.stage, receipt.prev) == ("refused", "request", "0" * 64)
    assert stores.journal == ["receipts.append:refused"]


def test_a_forwarded_request_is_released_after_its_receipt_and_its_reply_names_it() -> None:
    stores = Stores()
    s = stores.stream()
    first = send(s, chat(f"mail {EMAIL}"))
    assert first.phase == "request_body" and stores.journal == ["receipts.append:forwarded"]
    [receipt] = stores.receipts.receipts
    assert s.exchange.record.receipt_hash == receipt.hash
    assert s.response_headers().headers["x-cordon-receipt"] == receipt.hash


def test_receipts_chain_per_tenant() -> None:
    stores = Stores()
    for tenant in ("acme", "open", "acme"):
        send(stores.stream(tenant), chat("hello"))
    acme = stores.receipts.chain("acme")
    assert [r.prev for r in acme] == ["0" * 64, acme[0].hash]
    assert stores.receipts.chain("open")[0].prev == "0" * 64


AUDIT_REFUSED = "the audit record could not be written; the request was not forwarded"


@pytest.mark.parametrize(
    ("tenant", "subject"),
    [("acme", True), ("open", True), ("acme", False)],
    ids=["subject", "subject-open", "closed"],
)
def test_a_receipt_store_that_fails_refuses_503_audit(tenant: str, subject: bool) -> None:
    stores = Stores()
    extra = [("x-cordon-subject", SUBJECT)] if subject else []
    s = stores.stream(tenant, *extra)
    stores.receipts.fail_next()
    answer = send(s, chat(f"Write to Marisol Quintero-Vance at {EMAIL}"))
    refused_with(answer, 503, "audit", AUDIT_REFUSED)
    assert answer.json()["error"]["type"] == "server_error"
    assert "x-cordon-receipt" not in answer.headers
    assert stores.receipts.receipts == [] and stores.receipts.settlements == []
    record = s.exchange.record
    assert (record.decision, record.stage, record.status) == ("refused", "audit", 503)
    assert s.runtime.metrics.counter("cordon_redis_errors_total") == 1


def test_a_receipt_store_that_fails_under_fail_mode_open_forwards_with_a_gap() -> None:
    stores = Stores()
    s = stores.stream("open")
    stores.receipts.down = True
    answer = send(s, chat(f"mail {EMAIL}"))
    n = s.exchange.context.placeholders.nonce if s.exchange.context else ""
    assert answer.phase == "request_body" and answer.json() == chat(f"mail <EMAIL_{n}_1>")
    assert s.exchange.record.gap == "audit"
    assert s.exchange.record.decision == "forwarded"
    assert s.runtime.metrics.counter("cordon_gaps_total", what="audit") == 1
    assert "x-cordon-receipt" not in s.response_headers().headers


def test_a_refusal_whose_receipt_fails_still_goes_without_its_header() -> None:
    stores = Stores()
    s = stores.stream()
    stores.receipts.down = True
    answer = send(s, b"{not json")
    assert answer.refused and answer.status == 400
    assert json.loads(answer.body or b"")["error"]["code"] == "invalid_json"
    assert "x-cordon-receipt" not in answer.headers
    assert s.exchange.record.gap == "audit"


@pytest.mark.parametrize("reached", [False, True])
def test_an_uncertain_append_is_settled_with_the_refusals_record(reached: bool) -> None:
    stores = Stores()
    s = stores.stream("acme", ("x-cordon-subject", SUBJECT))
    stores.receipts.fail_next(uncertain=True, reached=reached)
    answer = send(s, chat("Write to Marisol Quintero-Vance"))
    refused_with(answer, 503, "audit", AUDIT_REFUSED)
    [settlement] = stores.receipts.settlements
    prev, lost = settlement.uncertain
    assert prev == "0" * 64
    if reached:  # the forwarded record made it in; the refusal's record will follow it
        [receipt] = stores.receipts.receipts
        assert (receipt.hash, receipt.decision) == (lost, "forwarded")
    else:
        assert stores.receipts.receipts == []
    correction = settlement.correction
    assert (correction.decision, correction.stage, correction.exchange) == ("refused", "audit", lost)
    assert (correction.egress, dict(correction.counts)) == ("verified", {"SUBJECT1_NAME": 1})


# --- consistent pseudonyms ------------------------------------------------------------------------


def test_consistent_pseudonyms_are_in_the_vault_before_the_body_is_released() -> None:
    stores = Stores()
    s = stores.stream("pseudo")
    answer = send(s, chat(f"mail {EMAIL}"))
    [placeholder] = stores.vault.entries["pseudo"]
    assert placeholder.startswith("<EMAIL_") and len(placeholder) == len("<EMAIL_>") + 20
    assert answer.json() == chat(f"mail {placeholder}")
    assert stores.vault.entries["pseudo"][placeholder] == EMAIL
    assert stores.journal == ["vault.put", "receipts.append:forwarded"]
    # The same value, another request: the same pseudonym.
    again = send(stores.stream("pseudo"), chat(f"write to {EMAIL}"))
    assert again.json() == chat(f"write to {placeholder}")


def test_a_vault_that_fails_refuses_503_vault() -> None:
    stores = Stores()
    s = stores.stream("pseudo")
    stores.vault.fail_next("put")
    answer = send(s, chat(f"mail {EMAIL}"))
    refused_with(
        answer, 503, "vault", "the pseudonym vault could not be written; the request was not forwarded"
    )
    assert stores.vault.entries == {}
    assert stores.journal == ["vault.put", "receipts.append:refused"]
    [receipt] = stores.receipts.receipts
    assert (receipt.stage, answer.headers["x-cordon-receipt"]) == ("vault", receipt.hash)
    assert s.runtime.metrics.counter("cordon_vault_errors_total", op="write") == 1


def test_nothing_to_redact_writes_nothing_to_the_vault() -> None:
    stores = Stores()
    send(stores.stream("pseudo"), chat("hello"))
    assert stores.journal == ["receipts.append:forwarded"]


def test_consistent_pseudonyms_without_a_vault_are_refused_at_the_headers() -> None:
    receipts = FakeReceipts()
    s = EnvoyStream(make_runtime(PSEUDONYMS, receipts=receipts))
    answer = s.request_headers(headers=[("x-api-key", "sk-pseudo")])
    refused_with(answer, 503, "vault", "consistent pseudonyms are not configured (TENANT_SECRET)")


# --- surrogates -----------------------------------------------------------------------------------


def test_surrogate_mode_puts_surrogates_in_the_body_and_restores_them() -> None:
    stores = Stores()
    s = stores.stream("surro")
    answer = send(s, chat(f"mail {EMAIL} or call {PHONE}"))
    key = stores.vault.pseudonym_key("surro")
    email = candidate(key, family_of("EMAIL"), EMAIL, 0)
    phone = candidate(key, family_of("PHONE"), PHONE, 0)
    assert email.endswith("@example.invalid") and "555" in phone
    assert answer.json() == chat(f"mail {email} or call {phone}")
    assert answer.headers == {"content-length": str(len(answer.body or b""))}
    assert stores.journal == ["vault.claim", "receipts.append:forwarded"]
    assert dict(stores.receipts.receipts[0].counts) == {"EMAIL": 1, "PHONE": 1}
    # The reply names the surrogates: the client reads its own values.
    s.response_headers()
    reply = s.response_body(chat_reply(f"I will write to {email} and call {phone}."))
    assert reply.json() == chat_reply(f"I will write to {EMAIL} and call {PHONE}.")


def test_surrogates_are_the_same_in_every_request_of_the_tenant() -> None:
    stores = Stores()
    first = send(stores.stream("surro"), chat(f"mail {EMAIL}"))
    second = send(stores.stream("surro"), chat(f"mail {EMAIL}"))
    assert first.body == second.body


def test_a_surrogate_claim_that_fails_refuses_503_vault() -> None:
    stores = Stores()
    s = stores.stream("surro")
    stores.vault.fail_next("claim")
    answer = send(s, chat(f"mail {EMAIL}"))
    refused_with(answer, 503, "vault", "surrogates could not be claimed; the request was not forwarded")
    assert s.runtime.metrics.counter("cordon_vault_errors_total", op="claim") == 1
    assert stores.journal == ["vault.claim", "receipts.append:refused"]


def test_no_free_surrogate_refuses_503_vault() -> None:
    stores = Stores()
    s = stores.stream("surro")
    stores.vault.fail_next("claim", SurrogateExhausted("no free EMAIL surrogate"))
    answer = send(s, chat(f"mail {EMAIL}"))
    refused_with(answer, 503, "vault", "surrogates could not be claimed; the request was not forwarded")


def test_surrogate_mode_without_a_vault_is_refused_at_the_headers() -> None:
    receipts = FakeReceipts()
    answer = EnvoyStream(make_runtime(SURROGATES, receipts=receipts)).request_headers(
        headers=[("x-api-key", "sk-surro")]
    )
    refused_with(answer, 503, "vault", "surrogates are not configured (TENANT_SECRET)")
    assert receipts.receipts[0].stage == "vault"
