"""One table from a failure to the refusal the client gets: status, stage and code.

Lower layers (the JSON walker, the detectors, OCR, the vault, the receipt store) raise errors of
the `CordonError` tree that say what went wrong and never choose an HTTP status; the exchange
turns them into a `Refusal` here and nowhere else. A request without declared subjects refuses a
failure of its own pipeline only under `failMode: closed` (`FAIL_CLOSED`); a request that
declares subjects refuses every failure (`RULES`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ext_proc.audit.receipts.chain import ReceiptError
from ext_proc.detect.subjects.header import SubjectHeaderError
from ext_proc.errors import CordonError, DetectionError, Refusal, Stage
from ext_proc.exchange.headers import CredentialError, LookalikeHeader
from ext_proc.exchange.runtime import BodyTooLarge
from ext_proc.media.image import MaskError, OcrTimeout
from ext_proc.storage.vault import SurrogateExhausted, VaultError
from ext_proc.transform.actions import KindBlocked
from ext_proc.transform.walk import KeyCollision, NestingTooDeep, NotJson


@dataclass(frozen=True, slots=True)
class Rule:
    status: int
    stage: Stage
    code: str = "request_refused"
    prefix: str = ""  # put before the error's own message


RULES: dict[type[CordonError], Rule] = {
    NotJson: Rule(400, "request", "invalid_json"),
    BodyTooLarge: Rule(413, "request", "request_too_large"),
    CredentialError: Rule(400, "request", "invalid_credentials"),
    LookalikeHeader: Rule(400, "request", "invalid_header"),
    NestingTooDeep: Rule(422, "detection", "nesting_too_deep"),
    KeyCollision: Rule(422, "detection", "redacted_keys_collide"),
    KindBlocked: Rule(422, "policy", "policy_blocked"),
    SubjectHeaderError: Rule(400, "request", "invalid_subject_header", prefix="X-Cordon-Subject: "),
    DetectionError: Rule(422, "detection"),
    OcrTimeout: Rule(503, "media"),
    MaskError: Rule(422, "media", prefix="media: mask refused an image: "),
    VaultError: Rule(503, "vault"),
    SurrogateExhausted: Rule(503, "vault"),
    ReceiptError: Rule(503, "audit"),
}

# Requests without declared subjects, under failMode: closed: a dependency of the pipeline failed.
FAIL_CLOSED: dict[type[CordonError], Rule] = {DetectionError: Rule(503, "detection")}


def rule_for(error: CordonError, table: dict[type[CordonError], Rule] = RULES) -> Rule | None:
    for cls in type(error).__mro__:
        rule = table.get(cls)
        if rule is not None:
            return rule
    return None


def refusal_for(
    error: CordonError, message: str | None = None, table: dict[type[CordonError], Rule] = RULES
) -> Refusal:
    """The refusal for `error`: its rule's status, stage and code, and `message` (else the rule's
    prefix and the error's own message, which never holds a value)."""
    if isinstance(error, Refusal):
        return error
    rule = rule_for(error, table)
    if rule is None:
        raise TypeError(f"no refusal rule for {type(error).__name__}")
    return Refusal(rule.status, rule.stage, message or f"{rule.prefix}{error}", code=rule.code)
