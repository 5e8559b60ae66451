"""Properties of what leaves outside the body (ext_proc.exchange.envelope): a catalog value or a
declared identifier put into any header or query parameter never leaves readable, and whatever
holds nothing is sent back byte for byte.

Each example builds a request's headers and query from harmless random parts, puts one value (a
catalog sample or a rendering of a declared identifier) into one random header or parameter, and
checks the envelope: the value is gone from what would leave (or, for a declared identifier that
redaction does not take, the egress check reports it), and every other header and parameter is
unchanged.
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import quote, unquote_plus

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.dialects import classify
from ext_proc.exchange.context import RequestContext
from ext_proc.exchange.envelope import HEADER_MEMO, rewritten, survivor
from ext_proc.exchange.headers import Headers
from ext_proc.transform.placeholders import PlaceholderMap
from tests.support.e2e import PERSON, SAMPLES, leaked
from tests.support.examples import example_count
from tests.support.fakes import keyed

HEADER = parse_subject_header(encode_subject_header({"subjects": [PERSON]}))
COMPILED = compile_subjects(HEADER)
POLICY = keyed("acme", "sk-acme")
ROUTE = classify("openai", "/v1/chat/completions")
DECLARED = ["Marisol Quintero-Vance", "mq@example.com", "+1 404 555 0187", "A1234567", "mqvance77"]
CORES = ["marisol", "quinterovance", "mqexamplecom", "4045550187", "a1234567", "mqvance77"]

# Harmless parts: lower-case words and small numbers, nothing the catalog or the subjects read.
WORD = st.sampled_from(["alpha", "beta", "gamma", "delta", "planner", "python", "linux", "v2", "42", "7"])
TEXT = st.lists(WORD, min_size=1, max_size=4).map(" ".join)
NAME = st.lists(
    st.sampled_from(["x", "agent", "trace", "note", "client", "meta"]), min_size=2, max_size=3
).map("-".join)


def headers_for(extra: dict[str, str], query: list[tuple[str, str]]) -> Headers:
    path = "/v1/chat/completions"
    if query:
        path += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)
    values = {":method": "POST", ":path": path, ":authority": "127.0.0.1", "authorization": "Bearer sk-x"}
    return Headers({**values, **extra}, False, "openai")


def cores_in(text: str) -> list[str]:
    alnum = "".join(c for c in unquote_plus(text).lower() if c.isalnum())
    return [core for core in CORES if core in alnum]


def check(
    headers: dict[str, str], query: list[tuple[str, str]], target: int, value: str, *, declared: bool
) -> None:
    names = list(headers)
    in_query = target >= len(names)
    if in_query:
        index = target - len(names)
        query = [*query[:index], (query[index][0], f"{query[index][1]} {value} ok"), *query[index + 1 :]]
    else:
        headers = {**headers, names[target]: f"{headers[names[target]]} {value} ok"}
    request = headers_for(headers, query)
    context = RequestContext(
        POLICY, ROUTE, PlaceholderMap(), HEADER if declared else None, COMPILED if declared else None
    )
    envelope = rewritten(context, request, Counter())
    sent = " ".join(f"{k} {v}" for k, v in envelope.values.items() if k != "authorization")
    if declared:
        assert cores_in(sent) == [] or survivor(COMPILED, envelope, context.placeholders.nonce) is not None
    else:
        assert leaked(unquote_plus(sent)) == []
    changed = {name for name, _ in envelope.set_headers}
    assert changed == ({":path"} if in_query else {names[target]})
    if in_query:  # the other parameters go as they came, byte for byte
        before = request.path.split("?", 1)[1].split("&")
        after = envelope.values[":path"].split("?", 1)[1].split("&")
        assert [a for a, b in zip(before, after, strict=True) if a != b] == [before[target - len(names)]]


HEADERS = st.dictionaries(NAME, TEXT, min_size=1, max_size=4)
QUERY = st.lists(st.tuples(WORD, TEXT), min_size=1, max_size=4)


@settings(max_examples=example_count(300), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    headers=HEADERS, query=QUERY, pick=st.integers(0, 100), value=st.sampled_from(sorted(SAMPLES.values()))
)
def test_a_catalog_value_outside_the_body_never_leaves(
    headers: dict[str, str], query: list[tuple[str, str]], pick: int, value: str
) -> None:
    check(headers, query, pick % (len(headers) + len(query)), value, declared=False)


@settings(max_examples=example_count(300), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(headers=HEADERS, query=QUERY, pick=st.integers(0, 100), value=st.sampled_from(DECLARED))
def test_a_declared_identifier_outside_the_body_never_leaves_unnoticed(
    headers: dict[str, str], query: list[tuple[str, str]], pick: int, value: str
) -> None:
    check(headers, query, pick % (len(headers) + len(query)), value, declared=True)


@pytest.mark.slow
@settings(max_examples=5000, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    headers=HEADERS,
    query=QUERY,
    pick=st.integers(0, 100),
    value=st.sampled_from([*sorted(SAMPLES.values()), *DECLARED]),
)
def test_nothing_outside_the_body_leaves_many(
    headers: dict[str, str], query: list[tuple[str, str]], pick: int, value: str
) -> None:
    check(headers, query, pick % (len(headers) + len(query)), value, declared=value in DECLARED)


@settings(max_examples=example_count(200), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    headers=HEADERS,
    query=QUERY,
    pick=st.integers(0, 100),
    value=st.sampled_from([*sorted(SAMPLES.values()), *DECLARED]),
)
def test_a_header_set_read_before_is_answered_as_if_read_afresh(
    headers: dict[str, str], query: list[tuple[str, str]], pick: int, value: str
) -> None:
    """A set of headers found clean is remembered as one: the same set again is answered clean
    from the memo, and the set with a value put into any one part is still read and rewritten."""
    context = RequestContext(POLICY, ROUTE, PlaceholderMap())
    clean = headers_for(headers, query)
    first = rewritten(context, clean, Counter())
    assert first.set_headers == () and first.removed == ()
    hits = HEADER_MEMO.hits
    again = rewritten(context, clean, Counter())
    assert HEADER_MEMO.hits > hits, "a clean set read again is answered from the memo"
    assert again == first
    # The remembered clean set must not answer for the same set with a value in it.
    check(headers, query, pick % (len(headers) + len(query)), value, declared=value in DECLARED)
    # And a set holding a value, read twice, is rewritten both times alike.
    target = pick % len(headers)
    name = list(headers)[target]
    dirty = headers_for({**headers, name: f"{headers[name]} {value}"}, query)
    counts = [Counter[str](), Counter[str]()]
    envelopes = [rewritten(context, dirty, counts[0]), rewritten(context, dirty, counts[1])]
    assert counts[0] == counts[1]
    assert dict(envelopes[0].set_headers).keys() == dict(envelopes[1].set_headers).keys()
