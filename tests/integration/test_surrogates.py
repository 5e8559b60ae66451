"""Realistic surrogates (`mode: surrogate`, issue 7 part 4): the generators per family
(ext_proc/surrogates.py), the registry that keeps them distinct and consistent per tenant
(`Vault.claim_surrogates`, a real redis-server), and the restorer (`SurrogateRestorer`) in plain
text, JSON, split streams and SSE in all three dialects.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import math
import string
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.dialects import DIALECTS
from ext_proc.errors import Refusal
from ext_proc.exchange.admission import override_mode
from ext_proc.policy.load import deployment_check
from ext_proc.policy.model import Policy, PolicyError
from ext_proc.restore.json_body import restore_json_body
from ext_proc.restore.restorers import SurrogateRestorer
from ext_proc.restore.sse import SseRestorer
from ext_proc.restore.stream import StreamRestorer
from ext_proc.storage.vault import (
    SURROGATE_PURPOSE,
    SurrogateExhausted,
    SurrogateWanted,
    Vault,
    derive_keys,
    seal,
    surrogate_entry,
    surrogate_id,
)
from ext_proc.transform.date_neighbours import full_years, move_neighbours
from ext_proc.transform.placeholders import PlaceholderMap
from ext_proc.transform.surrogates import (
    FAMILY_NAMES,
    GIVEN_NAMES,
    MAX_ATTEMPTS,
    MIN_TOKEN_BITS,
    NANP_AREAS,
    SURROGATE_DOMAIN,
    UK_DRAMA,
    candidate,
    date_shift_days,
    family_of,
    shift_date,
)
from tests.support.harness import RedisProcess

T = TypeVar("T")
SECRET = "surrogate-test-secret-0123456789abcdefghij"
KEY = derive_keys(SECRET, "acme").pseudonym
TTL = 600


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def luhn_ok(number: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(number)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


# --- the generators -------------------------------------------------------------------------------


def test_catalog_emails_at_the_surrogate_domain_are_kept() -> None:
    from ext_proc.detect.catalog.engine import Catalog
    from ext_proc.transform.surrogates import surrogates_kept

    detect = surrogates_kept(Catalog.for_sets(("pii",)).detect)
    text = "ask nadia.okafor07@example.invalid or jane.roe@example.com"
    assert [text[f.start : f.end] for f in detect(text)] == ["jane.roe@example.com"]


def test_families_of_labels() -> None:
    assert family_of("SUBJECT2_NAME") == "NAME"
    assert family_of("EMAIL") == family_of("SUBJECT1_EMAIL") == "EMAIL"
    assert family_of("SUBJECT3_DOB") == "DATE"
    assert family_of("OPENAI_KEY") == "TOKEN:OPENAI_KEY"
    assert family_of("SUBJECT1_ADDRESS") == "TOKEN:SUBJECT_ADDRESS"


def test_a_name_is_a_lexicon_pair_and_an_email_is_at_the_reserved_domain() -> None:
    assert len(GIVEN_NAMES) * len(FAMILY_NAMES) >= 10_000
    assert len(set(GIVEN_NAMES)) == len(GIVEN_NAMES) and len(set(FAMILY_NAMES)) == len(FAMILY_NAMES)
    name = candidate(KEY, "NAME", "Marisol Quintero-Vance", 0)
    given, family = name.split(" ")
    assert given in GIVEN_NAMES and family in FAMILY_NAMES
    email = candidate(KEY, "EMAIL", "mq@example.com", 0)
    local, domain = email.split("@")
    assert (domain == SURROGATE_DOMAIN and local.islower()) or local[-2:].isdigit()
    assert "mq" not in local.split(".")


@pytest.mark.parametrize(
    ("original", "region"),
    [
        ("+1 404-555-0187", "nanp"),
        ("404.555.0187", "nanp"),
        ("(404) 555-0187", "nanp"),
        ("14045550187", "nanp"),
        ("+33 1 42 68 53 00", "nanp"),  # another country: a NANP fiction, international
        ("+44 20 7946 0958", "uk"),
        ("07911 123456", "uk"),
    ],
)
def test_phones_are_fictional_and_keep_the_layout(original: str, region: str) -> None:
    for attempt in range(5):
        phone = candidate(KEY, "PHONE", original, attempt)
        d = digits(phone)
        if region == "nanp":
            national = d[-10:]
            assert national[:3] in NANP_AREAS and national[3:8] == "55501", phone
        else:
            national = d.removeprefix("44").removeprefix("0")
            assert any(national.startswith(prefix) for prefix, _ in UK_DRAMA), phone
        if region != "nanp" or not original.startswith("+33"):
            # The original's separators stay where they were.
            assert [c for c in phone if not c.isdigit()] == [c for c in original if not c.isdigit()]


def test_a_phone_layout_with_control_characters_stays_safe() -> None:
    phone = candidate(KEY, "PHONE", "404\n555\t0187", 0)
    assert phone.isprintable() and phone.isascii() and len(digits(phone)) == 10


def test_catalog_kinds_get_never_issued_or_documentation_values() -> None:
    for attempt in range(20):
        ssn = candidate(KEY, "SSN", "123-45-6789", attempt)
        assert ssn[0] == "9" and len(ssn) == 11 and ssn[3] == ssn[6] == "-"
        card = candidate(KEY, "CREDIT_CARD", "4111 1111 1111 1111", attempt)
        assert card[0] == "0" and luhn_ok(digits(card)) and len(card) == 19 and card[4] == " "
        iban = candidate(KEY, "IBAN", "DE89 3704 0044 0532 0130 00", attempt)
        compact = iban.replace(" ", "")
        moved = compact[4:] + compact[:4]
        assert iban[:2] == "DE" and int("".join(str(int(c, 36)) for c in moved)) % 97 != 1
        v4 = ipaddress.ip_address(candidate(KEY, "IP", "10.1.2.3", attempt))
        assert any(
            v4 in ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
        )
        assert int(str(v4).rsplit(".", 1)[1]) >= 20  # not the hosts a model writes in examples
        v6 = ipaddress.ip_address(candidate(KEY, "IP", "fe80::1", attempt))
        assert v6 in ipaddress.ip_network("2001:db8::/32")


SAFE = set(string.printable) - set('"\\<>\t\n\r\x0b\x0c')


@settings(max_examples=300, deadline=None)
@given(
    family=st.sampled_from(
        ["NAME", "EMAIL", "PHONE", "DATE", "SSN", "CREDIT_CARD", "IBAN", "IP", "TOKEN:OPENAI_KEY"]
    ),
    original=st.text(min_size=1, max_size=40),
    attempt=st.integers(0, MAX_ATTEMPTS - 1),
)
def test_a_candidate_is_safe_ascii_and_never_the_original(family: str, original: str, attempt: int) -> None:
    """Whatever the value: the surrogate needs no JSON escaping at any depth, and is not the value."""
    text = candidate(KEY, family, original, attempt)
    assert set(text) <= SAFE
    assert text.casefold() != original.casefold()
    assert text == candidate(KEY, family, original, attempt)  # a pure function


def bits(text: str) -> float:
    return sum(math.log2(10) if c.isdigit() else math.log2(26) for c in text if c.isalnum())


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=60))
def test_a_token_keeps_separators_and_character_classes_and_is_never_short(secret: str) -> None:
    """The shape is kept (length, separators, which positions are digits or which case); a shape
    carrying fewer than MIN_TOKEN_BITS is lengthened after its last letter or digit, with
    characters of that one's class, until it carries them."""
    token = candidate(KEY, "TOKEN:HIGH_ENTROPY", secret, 0)
    if token == "":
        return  # drawn as itself: the claim takes the next attempt
    assert bits(token) >= MIN_TOKEN_BITS
    if not any(c.isalnum() for c in secret):
        assert token.isalpha()  # no shape to keep: a random word
        return
    if bits(secret) >= MIN_TOKEN_BITS:
        assert len(token) == len(secret)
    extra = len(token) - len(secret)
    end = max((i + 1 for i, c in enumerate(secret) if c.isalnum()), default=len(secret))
    shape = token[:end] + token[end + extra :]
    for a, b in zip(secret, shape, strict=True):
        assert a.isdigit() == b.isdigit() and a.isupper() == b.isupper() and a.islower() == b.islower()
        if not a.isalnum():
            assert a == b
    if extra and end and secret[end - 1].isdigit():
        assert token[end : end + extra].isdigit()


@pytest.mark.parametrize("value", ["42", "7", "ab", "Q7", "A-1", "x.", "¼", "--", "4471", "K-77"])
def test_a_short_value_gets_a_surrogate_the_model_would_not_write(value: str) -> None:
    """A two-digit id with a two-digit surrogate would make every such number of the reply (a
    count, a list's numbering) come back as the id: short shapes are lengthened."""
    for attempt in range(10):
        token = candidate(KEY, "TOKEN:SUBJECT_ID", value, attempt)
        assert bits(token) >= MIN_TOKEN_BITS, attempt
        if value.isdigit():
            assert token.isdigit() and len(token) >= 8
        assert set(token) <= SAFE


def test_the_date_shift_is_per_tenant_constant_whole_weeks_and_never_small() -> None:
    tenants = ("acme", "beta", "gamma", "delta", *(f"t{i}" for i in range(40)))
    shifts = {date_shift_days(derive_keys(SECRET, t).pseudonym) for t in tenants}
    assert len(shifts) > 1
    assert all(365 <= abs(s) < 3650 and s % 7 == 0 for s in shifts)
    assert any(s < 0 for s in shifts) and any(s > 0 for s in shifts)
    assert date_shift_days(KEY) == date_shift_days(derive_keys(SECRET, "acme").pseudonym)


@pytest.mark.parametrize(
    ("original", "days", "expected"),
    [
        ("1986-07-14", 10, "1986-07-24"),
        ("1986/7/4", 30, "1986/8/3"),
        ("07/14/1986", 365, "07/14/1987"),
        ("14.07.1986", -14, "30.06.1986"),
        ("7/14/86", 1, "7/15/86"),
        ("July 14, 1986", 20, "August 3, 1986"),
        ("Jul 14 1986", 20, "Aug 3 1986"),
        ("14th of July 1986", 8, "22nd of July 1986"),
        ("14 JULY 1986", 1, "15 JULY 1986"),
        ("not a date", 5, None),
        ("1986-02-30", 5, None),
    ],
)
def test_a_shifted_date_keeps_its_written_form(original: str, days: int, expected: str | None) -> None:
    assert shift_date(original, days, today_year=2026) == expected


FORMS = {
    "iso": lambda d: d.strftime("%Y-%m-%d"),
    "us": lambda d: f"{d.month}/{d.day}/{d.year}",
    "eu": lambda d: d.strftime("%d.%m.%Y"),
    "spelled": lambda d: f"{d.strftime('%B')} {d.day}, {d.year}",
}
DATES = st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2090, 12, 31))


def parse_form(form: str, text: str) -> dt.date:
    pattern = {"iso": "%Y-%m-%d", "us": "%m/%d/%Y", "eu": "%d.%m.%Y", "spelled": "%B %d, %Y"}[form]
    return dt.datetime.strptime(text, pattern).date()


@settings(max_examples=300, deadline=None)
@given(a=DATES, b=DATES, form=st.sampled_from(sorted(FORMS)))
def test_intervals_between_dates_survive(a: dt.date, b: dt.date, form: str) -> None:
    """Any two dates, any of the forms: the surrogates are as far apart as the originals, and each
    is the original moved by the tenant's one shift."""
    shift = date_shift_days(KEY)
    sa = candidate(KEY, "DATE", FORMS[form](a), 0)
    sb = candidate(KEY, "DATE", FORMS[form](b), 0)
    da, db = parse_form(form, sa), parse_form(form, sb)
    assert (db - da) == (b - a)
    assert (da - a).days == shift
    assert da.weekday() == a.weekday()  # a weekday written or worked out tells nothing of the shift
    if a != b:
        assert sa != sb


# --- an age or year next to a date moves with it ----------------------------------------------------

DOB = "<SUBJECT1_DOB_0123abcd_1>"
TODAY = dt.date(2026, 5, 1)


def moved(text: str, original: str = "1986-07-14", days: int = -7 * 366) -> tuple[str, dict[str, str]]:
    surrogate = shift_date(original, days)
    assert surrogate is not None
    return move_neighbours(text, {DOB: (original, surrogate)}, TODAY)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"born {DOB}, aged 39 and well", f"born {DOB}, aged 46 and well"),
        (f"a 39-year-old, born {DOB}.", f"a 46-year-old, born {DOB}."),
        (f"age: 39, DOB: {DOB}", f"age: 46, DOB: {DOB}"),
        (f"{DOB} (39)", f"{DOB} (46)"),
        (f"{DOB}, 39 years old", f"{DOB}, 46 years old"),
        (f"{DOB} (1986)", f"{DOB} (1979)"),
        (f"{DOB} 2004", f"{DOB} 2004"),  # another year: not the date's
        (f"{DOB} and 12 more words then aged 39", f"{DOB} and 12 more words then aged 39"),
        (f"Room 39 is where {DOB} was", f"Room 39 is where {DOB} was"),
    ],
)
def test_an_age_or_the_dates_year_right_next_to_a_date_moves_with_it(text: str, expected: str) -> None:
    out, _ = moved(text)
    assert out == expected


def test_the_moved_age_is_the_one_the_shifted_date_gives() -> None:
    """Whatever the shift: the age next to the surrogate is the one the surrogate date gives
    today (so the pair reveals nothing), and the date with its age is one unit for restore."""
    original = dt.date(1986, 7, 14)
    for days in (-3640, -371, -7 * 200, 371, 7 * 300):
        surrogate = shift_date("1986-07-14", days)
        assert surrogate is not None
        age = full_years(original, TODAY)
        out, units = moved(f"born {DOB}, aged {age}", days=days)
        new_age = full_years(original + dt.timedelta(days=days), TODAY)
        assert out == f"born {DOB}, aged {new_age}"
        assert units == {f"{surrogate}, aged {new_age}": f"1986-07-14, aged {age}"}
        r = SurrogateRestorer({surrogate: "1986-07-14", **units}, "0123abcd")
        reply = f"Born {surrogate}, aged {new_age}. On {surrogate}, aged x. On {surrogate}"
        expected = f"Born 1986-07-14, aged {age}. On 1986-07-14, aged x. On 1986-07-14"
        assert r.restore_text(reply) == expected
        # Streamed, cut anywhere: the date alone is held while the unit could still follow.
        for i in range(len(reply) + 1):
            for j in range(i, len(reply) + 1, 7):
                stream = StreamRestorer(r)
                parts = (reply[:i], reply[i:j], reply[j:])
                assert "".join(stream.feed(part) for part in parts) + stream.flush() == expected, (i, j)


def test_a_date_that_is_not_read_moves_nothing() -> None:
    out, units = move_neighbours(f"{DOB}, aged 39", {DOB: ("sometime", "Xkqz")}, TODAY)
    assert out == f"{DOB}, aged 39" and units == {}


# --- the registry (a real Redis) ------------------------------------------------------------------


async def claim(
    url: str, tenant: str, wanted: list[SurrogateWanted], secret: str = SECRET
) -> dict[SurrogateWanted, str]:
    vault = Vault.from_url(url, secret=secret, timeout=5.0)
    try:
        return await vault.claim_surrogates(tenant, wanted, TTL)
    finally:
        await vault.aclose()


def names(n: int, prefix: str = "Person") -> list[SurrogateWanted]:
    return [SurrogateWanted("NAME", f"{prefix} Number{i}") for i in range(n)]


def test_many_values_never_share_a_surrogate(server: RedisProcess, client: redis.Redis) -> None:
    """3,000 names in a 15,000-pair lexicon: birthday collisions are certain, probing resolves
    them; later requests (in pieces, other processes' clients) get the same surrogates."""
    wanted = names(3000)
    first = run(claim(server.url, "acme", wanted))
    assert len(first) == 3000
    assert len({s.casefold() for s in first.values()}) == 3000
    plain = [candidate(KEY, "NAME", w.original, 0) for w in wanted]
    assert len(set(plain)) < 3000  # the first candidates did collide: the probing was needed
    again = run(claim(server.url, "acme", wanted[1000:1500]))
    assert all(again[w] == first[w] for w in wanted[1000:1500])
    assert len(list(client.scan_iter("cordon:{acme}:surrogate:*", count=1000))) == 3000


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(
        # At least 3 characters: a 1-character ID has only 9 or 25 possible surrogates.
        st.tuples(
            st.sampled_from(["NAME", "EMAIL", "PHONE", "IP", "TOKEN:ID"]), st.text(min_size=3, max_size=12)
        ),
        min_size=1,
        max_size=40,
        unique=True,
    )
)
def test_distinct_values_get_distinct_surrogates(server: RedisProcess, values: list[tuple[str, str]]) -> None:
    """Any values, claimed in two requests that share some: within the tenant no two distinct
    (family, value) pairs ever hold one surrogate, case folded, and a value keeps its surrogate."""
    tenant = "prop"
    with redis.Redis.from_url(server.url) as r:
        for key in r.scan_iter("cordon:{prop}:*"):
            r.delete(key)
    wanted = [SurrogateWanted(f, v) for f, v in values]
    half = len(wanted) // 2
    a = run(claim(server.url, tenant, wanted[: half + 1]))
    b = run(claim(server.url, tenant, wanted[half:]))
    merged = {**a, **b}
    assert all(a[w] == b[w] for w in a.keys() & b.keys())
    distinct_values = {(w.family, w.original) for w in merged}
    assert len({s.casefold() for s in merged.values()}) == len(distinct_values)
    assert all(s.casefold() != w.original.casefold() for w, s in merged.items())


def test_a_taken_candidate_moves_the_value_to_the_next(server: RedisProcess, client: redis.Redis) -> None:
    """The first candidate of a value is held by another value's entry: the value gets its second
    candidate, and keeps it in the next request."""
    mine = SurrogateWanted("NAME", "Marisol Quintero-Vance")
    first, second = candidate(KEY, "NAME", mine.original, 0), candidate(KEY, "NAME", mine.original, 1)
    keys = derive_keys(SECRET, "acme")
    ident = surrogate_id(keys.pseudonym, first)
    blob = seal(keys.vault, "acme", ident, surrogate_entry("NAME", "Someone Else"), SURROGATE_PURPOSE)
    client.set(f"cordon:{{acme}}:surrogate:{ident}", blob)
    got = run(claim(server.url, "acme", [mine]))
    assert got[mine] == second != first
    assert run(claim(server.url, "acme", [mine]))[mine] == second
    # An entry of the same value sealed under another key does not decrypt: taken, never read
    # as this value's.
    other = SurrogateWanted("NAME", "Octavia Brennan-Hale")
    first = candidate(KEY, "NAME", other.original, 0)
    ident = surrogate_id(keys.pseudonym, first)
    foreign = derive_keys(SECRET + "-other", "acme").vault
    blob = seal(foreign, "acme", ident, surrogate_entry("NAME", other.original), SURROGATE_PURPOSE)
    client.set(f"cordon:{{acme}}:surrogate:{ident}", blob)
    assert run(claim(server.url, "acme", [other]))[other] == candidate(KEY, "NAME", other.original, 1)


def test_a_candidate_the_request_must_avoid_is_skipped(server: RedisProcess, client: redis.Redis) -> None:
    """A clash with the request's own text skips the candidate (the value holds the next one
    too); without the clash the value gets its first one back."""
    mine = SurrogateWanted("EMAIL", "jane.roe@example.com")
    first, second = (candidate(KEY, "EMAIL", mine.original, n) for n in (0, 1))
    assert run(claim(server.url, "acme", [mine]))[mine] == first

    async def avoiding() -> dict[SurrogateWanted, str]:
        vault = Vault.from_url(server.url, secret=SECRET, timeout=5.0)
        try:
            return await vault.claim_surrogates("acme", [mine], TTL, avoid=lambda text: text == first)
        finally:
            await vault.aclose()

    assert run(avoiding())[mine] == second
    assert run(claim(server.url, "acme", [mine]))[mine] == first


def test_two_values_of_one_request_with_one_first_candidate(
    server: RedisProcess, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced: every value's first candidate is the same text. One request with three values gets
    three surrogates; the probe stops after MAX_ATTEMPTS with SurrogateExhausted (no value in it)."""
    import ext_proc.storage.vault as vault_module

    def forced(key: bytes, family: str, original: str, attempt: int) -> str:
        return "Shared Name" if attempt == 0 else candidate(key, family, original, attempt)

    monkeypatch.setattr(vault_module, "candidate", forced)
    wanted = [SurrogateWanted("NAME", v) for v in ("Ann One", "Bea Two", "Cid Three")]
    got = run(claim(server.url, "acme", wanted))
    assert len(set(got.values())) == 3 and sum(s == "Shared Name" for s in got.values()) == 1
    monkeypatch.setattr(vault_module, "candidate", lambda key, family, original, attempt: "Only One")
    assert run(claim(server.url, "acme", [SurrogateWanted("NAME", "Eve Five")])) != {}
    with pytest.raises(SurrogateExhausted) as raised:
        run(claim(server.url, "acme", [SurrogateWanted("NAME", "Dee Four")]))
    assert "Dee" not in str(raised.value)


def test_the_registry_holds_no_plaintext_and_expires(server: RedisProcess, client: redis.Redis) -> None:
    values = ["jane.roe@example.com", "Marisol Quintero-Vance", "+1 404-555-0187"]
    wanted = [SurrogateWanted(f, v) for f, v in zip(("EMAIL", "NAME", "PHONE"), values, strict=True)]
    got = run(claim(server.url, "acme", wanted))
    dump = b""
    for key in client.scan_iter("*"):
        dump += key + b"=" + (client.get(key) or b"")
        assert 0 < client.ttl(key) <= TTL
    for text in [*values, *got.values(), SECRET]:
        assert text.encode() not in dump


# --- restore ---------------------------------------------------------------------------------------

ORIGINALS = {
    "Nadia Okafor": "Marisol Quintero-Vance",
    "nadia.okafor07@example.invalid": 'mq"quoted"@example.com',
    "(212) 555-0143": "(404) 555-0187",
}


def restorer() -> SurrogateRestorer:
    return SurrogateRestorer(ORIGINALS, "0123abcd")


def test_restore_is_exact_case_blind_and_word_bounded() -> None:
    r = restorer()
    text = "Dear NADIA OKAFOR (nadia okafor), write to nadia.okafor07@example.invalid or (212) 555-0143."
    person = "Marisol Quintero-Vance"
    assert r.restore_text(text) == (
        f'Dear {person} ({person}), write to mq"quoted"@example.com or (404) 555-0187.'
    )
    for untouched in (
        "Nadia Okaforson",
        "xNadia Okafor",
        "Nadia Okafor_2",
        "nadia.okafor07@example.invalidx",
        # inside a longer token: a host, a decimal, a dotted or dashed name
        "nadia.okafor07@example.invalid.evil.test",
        "evil.nadia.okafor07@example.invalid",
        "(212) 555-0143.5",
        "(212) 555-0143-77",
    ):
        assert r.restore_text(untouched) == untouched
    assert r.restore_text("Nadia Okafor's file") == "Marisol Quintero-Vance's file"
    assert r.restore_text("Call (212) 555-0143.") == "Call (404) 555-0187."
    assert r.restore_text('{"to": "nadia.okafor07@example.invalid"}', json_escaped=True) == (
        '{"to": "mq\\"quoted\\"@example.com"}'
    )


def test_restore_json_body_and_the_gate_view() -> None:
    body = json.dumps({"choices": [{"message": {"content": "Hi Nadia Okafor"}}]}).encode()
    out = json.loads(restore_json_body(body, restorer()))
    assert out["choices"][0]["message"]["content"] == "Hi Marisol Quintero-Vance"
    gate_view = restorer().neutralise("mail nadia.okafor07@example.invalid, zed.other99@example.invalid ok")
    assert "@" not in gate_view


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, 120), max_size=12))
def test_a_stream_split_anywhere_restores_exactly(cuts: list[int]) -> None:
    text = "Call (212) 555-0143 or mail nadia.okafor07@example.invalid, Nadia Okafor. Nadia Okaforson stays."
    expected = restorer().restore_text(text)
    stream = StreamRestorer(restorer())
    out, last = "", 0
    for cut in sorted({min(c, len(text)) for c in cuts}):
        out += stream.feed(text[last:cut])
        last = cut
    out += stream.feed(text[last:]) + stream.flush()
    assert out == expected
    assert "Marisol Quintero-Vance" in out and "Nadia Okaforson" in out


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


REPLY = "To Nadia Okafor at nadia.okafor07@example.invalid."
RESTORED = 'To Marisol Quintero-Vance at mq"quoted"@example.com.'


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


STREAMS: dict[str, list[dict[str, Any]]] = {
    "chat": [
        *({"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces(REPLY)),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ],
    "responses": [
        *(
            {"type": "response.output_text.delta", "item_id": "m1", "content_index": 0, "delta": p}
            for p in pieces(REPLY)
        ),
        {"type": "response.output_text.done", "item_id": "m1", "content_index": 0, "text": REPLY},
    ],
    "messages": [
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in pieces(REPLY)
        ),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_stop"},
    ],
}


def delta_text(dialect: str, raw: bytes) -> str:
    out = ""
    for block in raw.split(b"\n\n"):
        if not block.startswith(b"data: "):
            continue
        event = json.loads(block[6:])
        if dialect == "chat":
            out += "".join(c["delta"].get("content", "") for c in event["choices"])
        elif dialect == "responses" and event["type"].endswith(".delta"):
            out += event["delta"]
        elif dialect == "messages" and event["type"] == "content_block_delta":
            out += event["delta"]["text"]
    return out


@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("dialect", sorted(STREAMS))
def test_sse_in_every_dialect_restores_split_surrogates(dialect: str, chunk: int) -> None:
    raw = sse(STREAMS[dialect])
    restorer_sse = SseRestorer(restorer(), DIALECTS[dialect])
    out = b"".join(restorer_sse.feed(raw[i : i + chunk]) for i in range(0, len(raw), chunk))
    out += restorer_sse.finish()
    assert delta_text(dialect, out) == RESTORED


def test_surrogates_in_structured_output_and_nested_arguments_read_back_exactly() -> None:
    """A surrogate is plain ASCII, but its original may hold quotes: written JSON-escaped where the
    surrogate sat in a JSON string, once per level, streamed at every cut or not."""
    doc = json.dumps({"to": "nadia.okafor07@example.invalid", "who": ["Nadia Okafor"]})
    args = json.dumps({"text": doc})
    expected = {"to": 'mq"quoted"@example.com', "who": ["Marisol Quintero-Vance"]}
    assert json.loads(restorer().restore_text(doc)) == expected
    assert json.loads(json.loads(restorer().restore_text(args, json_escaped=True))["text"]) == expected
    for text, escaped in ((doc, False), (args, True)):
        whole = restorer().restore_text(text, json_escaped=escaped)
        for i in range(len(text) + 1):
            stream = StreamRestorer(restorer(), json_escaped=escaped)
            assert stream.feed(text[:i]) + stream.feed(text[i:]) + stream.flush() == whole, i


def test_an_empty_request_map_restores_nothing() -> None:
    r = SurrogateRestorer({}, "0123abcd")
    assert not r.active and r.restore_text("Nadia Okafor") == "Nadia Okafor"


# --- policy -----------------------------------------------------------------------------------------


def test_surrogate_mode_needs_the_tenant_secret() -> None:
    policy = Policy(tenant="acme", mode="surrogate", source="acme.yaml")
    with pytest.raises(PolicyError) as raised:
        deployment_check(tenant_secret=False)(policy)
    assert raised.value.key == "mode" and "TENANT_SECRET" in raised.value.reason
    deployment_check(tenant_secret=True)(policy)
    assert policy.vault_retention == policy.vault_ttl_seconds


def test_x_redact_mode_may_tighten_to_but_never_loosen_into_surrogate() -> None:
    off = Policy(tenant="acme", mode="off", allow_header_override=True)
    assert override_mode(off, "surrogate").mode == "surrogate"
    surrogate = Policy(tenant="acme", mode="surrogate", allow_header_override=True)
    assert override_mode(surrogate, "reversible").mode == "reversible"
    for mode in ("reversible", "strip"):
        with pytest.raises(Refusal) as raised:
            override_mode(Policy(tenant="acme", mode=mode, allow_header_override=True), "surrogate")  # type: ignore[arg-type]
        assert raised.value.status == 403


def test_placeholder_map_is_what_redaction_fills_before_the_claim() -> None:
    """The per-request placeholders carry the label the family is read from."""
    pmap = PlaceholderMap()
    text = pmap.placeholder_for("SUBJECT1_DOB", "1986-07-14")
    assert family_of(text[1:].split("_" + pmap.nonce)[0]) == "DATE"
