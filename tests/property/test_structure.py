"""Key context, as a property: random JSON documents carrying catalog values, bare identifiers
under the keys that name them, secrets under secret keys and declared identifiers, at random key
paths, some nested in strings (tool arguments, pasted JSON) at random depth, leave nothing upstream.

Each example builds a document, runs the request pipeline (redaction and, with declared subjects,
the egress check) and reads everything that would leave, JSON inside strings included. A planted
value must be gone from it; a failure names the index of the value and its kind, never the value.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.dialects import DIALECTS
from ext_proc.exchange.pipeline import find_media, redact_and_check, redact_document
from ext_proc.policy.model import Policy
from ext_proc.transform.placeholders import PlaceholderMap
from tests.support.e2e import PERSON
from tests.support.examples import example_count

CATALOG = Catalog.for_sets(("pii", "pci", "secrets"))
SUBJECTS = compile_subjects(parse_subject_header(encode_subject_header({"subjects": [PERSON]})))

# Keys that name nothing, to build paths of.
NEUTRAL = ["data", "items", "record", "payload", "result", "info", "fields", "row", "user", "details"]
SSN_KEYS = ["ssn", "SSN", "social_security_number", "socialSecurityNumber", "tax_id", "taxpayer_id"]
PHONE_KEYS = ["phone", "phone_number", "phoneNumber", "PHONE", "mobile", "tel", "cell", "fax_number"]
SECRET_KEYS = [
    "password", "db_password", "passwd", "apiKey", "api_key", "client_secret", "access_token",
    "secret", "credentials", "private_key", "passcode", "x-api-key",
]  # fmt: skip
# Values the catalog knows by their shape wherever they are (invented; test card numbers).
SHAPED = [
    ("EMAIL", "odile.vasquez@example.org"),
    ("CREDIT_CARD", "5555 5555 5555 4444"),
    ("IBAN", "GB82 WEST 1234 5698 7654 32"),
    ("SSN", "219-09-9998"),
    ("PHONE", "+1 617-555-0186"),
    ("GITHUB_TOKEN", "ghp_" + "Qm7Xk2Lp9Rt4Vz8Nb3Hc6Jd1Fg5Sw0YaEiUoP"),
]
DECLARED = [
    ("SUBJECT_NAME", PERSON["names"][0]),
    ("SUBJECT_EMAIL", PERSON["emails"][0]),
    ("SUBJECT_ID", "A1234567"),
]


@dataclass(frozen=True)
class Planted:
    kind: str
    value: str  # what must not leave
    written: Any  # what the document carries (the value, a number, `Bearer <value>`)
    key: str | None  # the key it must sit under (None: any key)


ssn_digits = st.builds(
    lambda area, group, serial: f"{area:03d}{group:02d}{serial:04d}",
    st.integers(1, 665),
    st.integers(1, 99),
    st.integers(1, 9999),
)
phone_digits = st.builds(
    lambda area, line: f"{area}5550{line:03d}",
    st.sampled_from(["212", "415", "312", "617", "206"]),
    st.integers(100, 199),
)
secrets = st.from_regex(r"[a-z]{3,6}[A-Z][a-z]{2,5}[0-9]{2,4}[!#%\-]?", fullmatch=True)


@st.composite
def planted(draw: st.DrawFn) -> Planted:
    choice = draw(st.sampled_from(["shaped", "ssn", "phone", "secret", "declared"]))
    if choice == "shaped":
        kind, value = draw(st.sampled_from(SHAPED))
        key = draw(st.sampled_from([*NEUTRAL, *SECRET_KEYS, *PHONE_KEYS]))
        return Planted(kind, value, value, key)
    if choice == "declared":
        kind, value = draw(st.sampled_from(DECLARED))
        return Planted(kind, value, value, draw(st.sampled_from(NEUTRAL)))
    if choice == "ssn":
        value = draw(ssn_digits)
        written: Any = int(value) if draw(st.booleans()) and value[0] != "0" else value
        return Planted("SSN", value, written, draw(st.sampled_from(SSN_KEYS)))
    if choice == "phone":
        value = draw(phone_digits)
        written = int(value) if draw(st.booleans()) else value
        return Planted("PHONE", value, written, draw(st.sampled_from(PHONE_KEYS)))
    value = draw(secrets)
    key = draw(st.sampled_from([*SECRET_KEYS, "Authorization"]))
    return Planted("SECRET_ASSIGNMENT", value, f"Bearer {value}" if key == "Authorization" else value, key)


@st.composite
def placed(draw: st.DrawFn, item: Planted) -> Any:
    """`item` under its key, the key reached through a random path of neutral keys, wrappers,
    lists and name/value pairs; some levels of the path serialised into a string."""
    assert item.key is not None
    form = draw(st.sampled_from(["plain", "plain", "wrapped", "pair"]))
    if form == "wrapped":
        node: Any = {item.key: {draw(st.sampled_from(["value", "number", "raw"])): item.written}}
    elif form == "pair":
        node = {"name": item.key, "value": item.written}
    else:
        node = {item.key: item.written}
    for _ in range(draw(st.integers(0, 4))):
        step = draw(st.sampled_from(["dict", "list", "string"]))
        if step == "dict":
            node = {draw(st.sampled_from(NEUTRAL)): node, "note": "ok"}
        elif step == "list":
            node = [node, {"other": 1}]
        else:
            node = {draw(st.sampled_from(NEUTRAL)): json.dumps(node)}
    return node


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, dict[str, Any], list[Planted]]:
    items = draw(st.lists(planted(), min_size=1, max_size=5))
    record = {f"k{index}": draw(placed(item)) for index, item in enumerate(items)}
    where = draw(st.sampled_from(["content", "arguments", "metadata", "tool_result", "anthropic_tool_input"]))
    text = json.dumps(record)
    if draw(st.booleans()):
        text = json.dumps({"wrapped": text})  # one more level of JSON in a string
    if where == "content":
        return "chat", {"model": "m", "messages": [{"role": "user", "content": text}]}, items
    if where == "arguments":
        call = {"id": "call_1", "type": "function", "function": {"name": "save", "arguments": text}}
        return "chat", {"model": "m", "messages": [{"role": "assistant", "tool_calls": [call]}]}, items
    if where == "metadata":
        return (
            "chat",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": record},
            items,
        )
    if where == "tool_result":
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": text}
        return (
            "messages",
            {"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": [result]}]},
            items,
        )
    use = {"type": "tool_use", "id": "toolu_1", "name": "save", "input": record}
    return (
        "messages",
        {"model": "c", "max_tokens": 8, "messages": [{"role": "assistant", "content": [use]}]},
        items,
    )


def everything_read(value: Any, out: list[str]) -> None:
    """Every string and number a reader of `value` sees, JSON inside strings parsed too."""
    if isinstance(value, str):
        out.append(value)
        try:
            inner = json.loads(value)
        except ValueError:
            return
        if isinstance(inner, (dict, list)):
            everything_read(inner, out)
    elif isinstance(value, dict):
        for key, item in value.items():
            out.append(key)
            everything_read(item, out)
    elif isinstance(value, list):
        for item in value:
            everything_read(item, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(str(value))


def survivors(body: bytes, items: list[Planted]) -> list[tuple[int, str]]:
    read: list[str] = []
    everything_read(json.loads(body), read)
    joined = "\n".join(read)
    return [(index, item.kind) for index, item in enumerate(items) if item.value in joined]


def check(doc_case: tuple[str, dict[str, Any], list[Planted]], mode: str) -> None:
    dialect_name, doc, items = doc_case
    dialect = DIALECTS[dialect_name]
    policy = Policy(tenant="t", mode=mode)  # type: ignore[arg-type]
    raw = json.dumps(doc).encode()
    declares = any(item.kind.startswith("SUBJECT") for item in items)
    if declares:
        checked = redact_and_check(
            raw,
            json.loads(raw),
            policy=policy,
            dialect=dialect,
            catalog=CATALOG,
            placeholders=PlaceholderMap(),
            subjects=SUBJECTS,
            media=[],
            counts=Counter(),
        )
        assert checked.survivor is None, "a declared identifier survived to the egress check"
        body = checked.body
    else:
        parsed = json.loads(raw)
        redaction = redact_document(
            parsed,
            policy=policy,
            dialect=dialect,
            catalog=CATALOG,
            placeholders=PlaceholderMap(),
            subjects=None,
            media=find_media(parsed, dialect),
            counts=Counter(),
        )
        body = json.dumps(redaction.doc).encode()
    left = survivors(body, items)
    assert left == [], "planted values left upstream (index, kind)"


@settings(max_examples=example_count(300), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(case=documents(), mode=st.sampled_from(["reversible", "strip"]))
def test_nothing_planted_leaves(case: tuple[str, dict[str, Any], list[Planted]], mode: str) -> None:
    check(case, mode)


@pytest.mark.slow
@settings(max_examples=5000, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(case=documents(), mode=st.sampled_from(["reversible", "strip", "surrogate"]))
def test_nothing_planted_leaves_many(case: tuple[str, dict[str, Any], list[Planted]], mode: str) -> None:
    check(case, mode)
