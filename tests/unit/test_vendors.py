"""Vendor tokens (ext_proc/detect/catalog/vendors.py), the assignment forms added with them, the
documented examples left alone, and the trigger index that keeps them cheap.

Every token here is invented: bodies come from a seeded random generator in each family's
alphabet, assembled at run time so that secret scanners reading this file do not trip over them.
Assertion messages name kinds, families and offsets, never a value.
"""

from __future__ import annotations

import base64
import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog import engine
from ext_proc.detect.catalog.anchors import TOKEN_RUN_MIN, Scratch, Triggers
from ext_proc.detect.catalog.detectors import DETECTORS, DOCUMENTED_EXAMPLES
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.catalog.validators import base62_crc32, is_placeholder, token_checksum_valid
from ext_proc.detect.catalog.vendors import VENDOR_DETECTORS
from ext_proc.detect.findings import ALL_SETS, SETS
from ext_proc.restore.holdback import matches_space
from ext_proc.transform.surrogates import candidate, family_of
from tests.support.examples import example_count

ALL = Catalog.for_sets(ALL_SETS)
SECRETS = Catalog.for_sets(("secrets",))

_RNG = random.Random(20240917)
B62 = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
URLSAFE = B62 + "_-"


def rand(alphabet: str, n: int) -> str:
    """Random characters, with at least one digit and both cases where the alphabet has them."""
    while True:
        value = "".join(_RNG.choice(alphabet) for _ in range(n))
        needs = [set(string.digits), set(string.ascii_lowercase), set(string.ascii_uppercase)]
        if all(not (need & set(alphabet)) or (need & set(value)) for need in needs):
            return value


def p(*parts: str) -> str:
    return "".join(parts)


def kinds_at(text: str, catalog: Catalog = ALL) -> list[tuple[str, int, int]]:
    return [(f.kind, f.start, f.end) for f in catalog.detect(text)]


def covered(text: str, value: str, kind: str = "API_TOKEN") -> bool:
    start = text.index(value)
    end = start + len(value)
    return any(f.kind == kind and f.start <= start and end <= f.end for f in ALL.detect(text))


def npm_token() -> str:
    body = rand(B62, 30)
    return p("npm", "_", body, base62_crc32(body))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def discord_token(bot_id: str) -> str:
    first = base64.urlsafe_b64encode(bot_id.encode()).decode().rstrip("=")
    return p(first, ".", rand(URLSAFE, 6), ".", rand(URLSAFE, 27))


# (family, the token as it is written): each must be found as API_TOKEN, covered whole.
TOKENS: list[tuple[str, str]] = [
    ("gitlab personal", p("gl", "pat-", rand(URLSAFE, 20))),
    (
        "gitlab routable",
        p("gl", "pat-", rand(URLSAFE, 27), ".01.", rand(string.ascii_lowercase + string.digits, 9)),
    ),
    ("gitlab deploy", p("gl", "dt-", rand(URLSAFE, 20))),
    ("gitlab agent", p("gl", "agent-", rand(URLSAFE, 50))),
    ("gitlab runner registration", p("GR13", "48941", rand(URLSAFE, 20))),
    ("hugging face", p("hf", "_", rand(string.ascii_letters, 34))),
    ("hugging face org", p("api", "_org_", rand(string.ascii_letters, 34))),
    ("npm", npm_token()),
    ("perplexity", p("pp", "lx-", rand(B62, 48))),
    ("groq", p("gs", "k_", rand(B62, 52))),
    ("xai", p("xa", "i-", rand(B62, 80))),
    ("replicate", p("r8", "_", rand(B62, 37))),
    ("nvidia", p("nv", "api-", rand(URLSAFE, 64))),
    ("sourcegraph", p("sg", "p_", rand(HEX, 40))),
    ("sourcegraph instance", p("sg", "p_", rand(HEX, 16), "_", rand(HEX, 40))),
    ("notion", p("nt", "n_", rand(B62, 46))),
    (
        "grafana cloud",
        p("gl", "c_", b64(b'{"o":"1234","n":"stack-42-write","k":"' + rand(B62, 24).encode() + b'"}')),
    ),
    ("grafana service account", p("gl", "sa_", rand(B62, 32), "_", rand(HEX, 8))),
    ("vault service", p("hv", "s.", rand(URLSAFE, 90))),
    ("terraform", p(rand(B62, 14), ".atlas", "v1.", rand(B62, 67))),
    ("databricks", p("da", "pi", rand(HEX, 32))),
    ("fly.io", p("fo", "1_", rand(URLSAFE, 43))),
    ("bedrock long-term", p("AB", "SK", b64(b"BedrockAPIKey-" + rand(B62, 82).encode()))),
    (
        "bedrock short-term",
        p(
            "bedrock",
            "-api-key-",
            b64(b"bedrock.amazonaws.com/?Action=CallWithBearerToken&X=" + rand(B62, 20).encode()),
        ),
    ),
    ("square oauth", p("sq", "0atp-", rand(URLSAFE, 22))),
    ("square secret", p("sq", "0csp-", rand(URLSAFE, 43))),
    ("square access", p("EA", "AA", rand(URLSAFE, 60))),
    ("sendgrid", p("S", "G.", rand(URLSAFE, 22), ".", rand(URLSAFE, 43))),
    ("pypi", p("py", "pi-AgEIcHlwaS5vcmc", rand(URLSAFE, 140))),
    ("sentry user", p("sn", "tryu_", rand(HEX, 64))),
    ("infracost", p("ic", "o-", rand(B62, 32))),
    ("octopus", p("AP", "I-", rand(string.ascii_uppercase + string.digits, 26))),
    ("openshift", p("sha256", "~", rand(URLSAFE, 43))),
    ("scalingo", p("tk", "-us-", rand(URLSAFE, 48))),
    ("42 intra", p("s-s4", "t2ud-", rand(HEX, 64))),
    ("heroku v2", p("HR", "KU-AA", rand(URLSAFE, 58))),
    ("digitalocean", p("do", "p_v1_", rand(HEX, 64))),
    ("shopify", p("shp", "at_", rand(HEX, 32))),
    ("linear", p("lin", "_api_", rand(B62, 40))),
    ("postman", p("PM", "AK-", rand(HEX, 24), "-", rand(HEX, 34))),
    ("doppler", p("dp", ".pt.", rand(B62, 43))),
    ("brevo", p("xkey", "sib-", rand(HEX, 64), "-", rand(B62, 16))),
    ("atlassian", p("AT", "ATT3", rand(URLSAFE, 180), "=", rand(HEX, 8).upper())),
    ("clickhouse", p("4b", "1d", rand(B62, 38))),
    ("cloudflare origin ca", p("v1", ".0-", rand(HEX, 24), "-", rand(HEX, 146))),
    ("maxmind", p(rand(B62, 6), "_", rand(B62, 29), "_m", "mk")),
    ("1password service account", p("op", "s_eyJ", rand(B62, 140))),
    (
        "1password secret key",
        p(
            "A",
            "3-",
            *(rand(string.ascii_uppercase + string.digits, n) + "-" for n in (6, 6, 5, 5, 5)),
            rand(string.ascii_uppercase + string.digits, 5),
        ),
    ),
    ("age", p("AGE-", "SECRET-KEY-1", rand("023456789ACDEFGHJKLMNPQRSTUVWXYZ", 58))),
    ("mailchimp", p(rand(HEX, 32), "-us", "14")),
    ("azure client secret", p(rand(B62, 3), "8Q", "~", rand(URLSAFE, 34))),
    ("telegram", p("7213808860", ":AA", rand(URLSAFE, 33))),
    ("discord", discord_token("1029481375959107204")),
]


@pytest.mark.parametrize(("family", "token"), TOKENS, ids=[f for f, _ in TOKENS])
def test_vendor_token_found_in_prose_code_and_json(family: str, token: str) -> None:
    for text in (f"my key is {token} thanks", f'KEY="{token}"', f'{{"value": "{token}"}}', token):
        assert covered(text, token), f"{family}: not covered in a text of {len(text)}; found {kinds_at(text)}"


@pytest.mark.parametrize(("family", "token"), TOKENS, ids=[f for f, _ in TOKENS])
def test_vendor_token_is_not_found_glued_to_a_word(family: str, token: str) -> None:
    if family in ("mailchimp", "discord"):
        return  # shapes that start with digits or letters of their own: tested below
    text = f"x{token}x"
    start = 1
    assert not any(
        f.kind == "API_TOKEN" and f.start <= start for f in ALL.detect(text) if f.end >= 1 + len(token)
    ), f"{family}: found inside a longer word"


NEAR_MISSES: list[tuple[str, str]] = [
    # placeholders after a real prefix
    ("gitlab mask", p("gl", "pat-", "x" * 20)),
    ("runner one repeated digit group", p("GR13", "48941", "12312312312312312312")),
    ("hugging face mask", p("hf", "_", "x" * 34)),
    ("hugging face camel-case name", p("hf", "_", "RequiredCharacteristicTypesForDisp")),
    ("hugging face lower-case name", p("hf", "_", "servingcellpriorityparametersdescr")),
    ("grafana one character", p("gl", "c_", "1" * 42, "=")),
    ("openshift placeholder words", p("sha256", "~", "XXXXXXXXXX_PUT_YOUR_TOKEN_HERE_XXXXXXXXXXXX")),
    ("sourcegraph low entropy", p("sg", "p_", "5555555dAAAAA7777777CcccCFaaaaaaaaaaaaaa")),
    ("databricks not hex", p("da", "pi", "123456789012345678a9bc01234defg5")),
    ("terraform mask", p("x" * 14, ".atlas", "v1.", "x" * 67)),
    ("vault mask", p("hv", "s.", "x" * 90)),
    ("vault short", p("hv", "s.", rand(URLSAFE, 24))),
    ("vault camel-case name", p("hv", "s.", "ClientConnectionPoolManager" * 4)),
    ("octopus capitals in order", p("AP", "I-", string.ascii_uppercase)),
    ("grafana camel-case name", p("gl", "c_", "CreateLightmapTextureArrayForLevels")),
    ("clickhouse mask", p("4b", "1d", "X" * 38)),
    ("azure mask", p("bP8", "8Q", "~", "x" * 34)),
    # wrong lengths and shapes
    ("notion too short", p("nt", "n_", "12345678901")),
    ("notion digits only", p("nt", "n_", "1" * 46)),
    ("octopus lower case", p("ap", "i-", rand(string.ascii_lowercase, 26))),
    ("octopus after a dot", p("notion.site/", "AP", "I-", rand(HEX, 32).upper())),
    ("infracost in a file name", p("video_box.", "ic", "o-", rand(HEX, 32), ".png")),
    ("bedrock too short", p("AB", "SKQmVkcm9ja0FQSUtleS1", "EXAMPLE")),
    ("bedrock other prefix", p("AX", "SK", b64(b"BedrockAPIKey-" + b"a" * 82))),
    ("bedrock short-term not the service", p("bedrock", "-api-key-", b64(b"bedrock.amazonaws.cox"))),
    ("mailchimp upper-case hex", p(rand(HEX, 32).upper(), "-us", "2")),
    ("mailchimp no datacenter", p(rand(HEX, 32), "-al", "32")),
    ("discord id not digits", p("MZ1yGvKTjE0rY0cV8i47CjAa", ".", rand(URLSAFE, 6), ".", rand(URLSAFE, 27))),
    (
        "discord middle too short",
        p(discord_token("198622483471925248").split(".")[0], ".", rand(URLSAFE, 5), ".", rand(URLSAFE, 27)),
    ),
    ("telegram glued to a word", p("foo", ":AA", rand(URLSAFE, 33))),
    ("age upper-case Bech32 only", p("AGE-", "SECRET-KEY-1", "b" * 58)),
]


@pytest.mark.parametrize(("case", "text"), NEAR_MISSES, ids=[c for c, _ in NEAR_MISSES])
def test_vendor_near_miss_is_no_api_token(case: str, text: str) -> None:
    found = [(s, e) for k, s, e in kinds_at(text) if k == "API_TOKEN"]
    assert not found, f"{case}: API_TOKEN at {found}"


def test_npm_checksum_is_read_and_settles_a_token_that_looks_like_a_word() -> None:
    body = rand(B62, 30)
    assert token_checksum_valid(body + base62_crc32(body))
    assert not token_checksum_valid(body + base62_crc32(body + "x"))
    assert len(base62_crc32("")) == 6 and base62_crc32("") == "000000"
    # A body without capitals or digits is no token by its look, but a valid checksum makes it one.
    wordy = "abcdefghijklmnopqrstuvwxyzabcd"
    checked = p("npm", "_", wordy, base62_crc32(wordy))
    assert covered(f"token {checked}", checked)
    # With a wrong checksum, only a random-looking body still counts (a typo is still a secret).
    unchecked = p("npm", "_", wordy, "zzzzzz")
    assert not covered(f"token {unchecked}", unchecked)
    random_body = rand(B62, 30)
    typo = p("npm", "_", random_body, base62_crc32(random_body)[::-1] + "")
    assert covered(f"token {typo}", typo)


def test_placeholders() -> None:
    assert is_placeholder("x" * 20)
    assert is_placeholder("XXXXXXXX-XXXXXX")
    assert is_placeholder("1" * 40)
    assert is_placeholder("x" * 14 + ".atlasv1." + "x" * 60)
    assert not is_placeholder(rand(B62, 32))
    assert not is_placeholder(rand(HEX, 32))


def test_random_base64_is_no_vendor_token() -> None:
    """A pasted blob (an image's base64 outside a media part) spells `EAA` and the like in its
    middle now and then: after `+` or `/` that is no token."""
    blob = base64.b64encode(random.Random(7).randbytes(48_000)).decode("ascii")
    assert not [s for k, s, _ in kinds_at(blob, SECRETS) if k == "API_TOKEN"]
    inside = p(blob[:40], "/", "EA", "A", rand(B62, 70), "+", blob[40:80])
    assert not [s for k, s, _ in kinds_at(inside, SECRETS) if k == "API_TOKEN"]


def test_telegram_keeps_the_bot_prefix_of_an_api_url() -> None:
    token = p("110201543", ":AA", rand(URLSAFE, 33))
    text = f"https://api.telegram.org/bot{token}/sendMessage"
    start = text.index(token)
    assert ("API_TOKEN", start, start + len(token)) in kinds_at(text)


# --- assignment forms added with the vendors ---------------------------------------------------

ASSIGNMENTS: list[tuple[str, str]] = [
    # curl's -u user:password (the password; the user when the password is empty)
    (p("curl -u elastic:", "Pq9wTxu4Fg-2 https://localhost:9200"), p("Pq9wTxu4Fg-2")),
    (p("curl --user 'api:", "d2LkV78zLx!t' https://api.example.com"), "d2LkV78zLx!t"),
    (p('curl -s --user "j.smith:', 'dB2yF6@qL9vZm1P#4J" "https://api.example.org/me"'), "dB2yF6@qL9vZm1P#4J"),
    (p('curl -u "', "sk_test_", 'k9Qz4LmW2:" https://api.example.com'), p("sk_test_", "k9Qz4LmW2")),
    (
        p("curl -X POST https://x.example.com \\\n  -d 'a=1' \\\n  -u dev:", "yqDVtkqPECriaLRi"),
        "yqDVtkqPECriaLRi",
    ),
    (p("curl --user=kevin:'", "pRf7vG2h1L8nQkW9' -iX PATCH"), "pRf7vG2h1L8nQkW9"),
    # Bundler credentials for a gem source
    (p("export BUNDLE_GEMS__", "CONTRIBSYS__COM=", "cafe1234:dead5678"), "cafe1234:dead5678"),
    (p("BUNDLE_ENTERPRISE__", 'EXAMPLE__COM: "', 'a1b2c3d4:e5f6a7b8"'), "a1b2c3d4:e5f6a7b8"),
    # a service's name before `key`, Makefile operators, `key : value` and `key:value` tokens
    (
        p('const HEROKU_KEY = "', "8c2d1f0e-93a1-4b77-a0c2-5e9f7d3b1a64", '"'),
        "8c2d1f0e-93a1-4b77-a0c2-5e9f7d3b1a64",
    ),
    (
        p('SNYK_TOKEN ?= "', "5b0c7e2a-1d4f-4c88-9b3e-7f6a2d1c0e95", '"'),
        "5b0c7e2a-1d4f-4c88-9b3e-7f6a2d1c0e95",
    ),
    (
        p('SNYK_TOKEN ::= "', "5b0c7e2a-1d4f-4c88-9b3e-7f6a2d1c0e95", '"'),
        "5b0c7e2a-1d4f-4c88-9b3e-7f6a2d1c0e95",
    ),
    (p("softlayer-key : ", "Zq8vT4mL0pX2Wn7Rb5Kc3Hd9Jf1Gs6Ya"), "Zq8vT4mL0pX2Wn7Rb5Kc3Hd9Jf1Gs6Ya"),
    (p("apikey:", "Zq8vT4mL0pX2Wn7Rb5Kc3Hd9Jf1Gs6Ya--__"), "Zq8vT4mL0pX2Wn7Rb5Kc3Hd9Jf1Gs6Ya--__"),
    (p("cloudant_pw='", "Xk9mP2vL7qR4tZ8w", "'"), "Xk9mP2vL7qR4tZ8w"),
    # the vendors' own names for a credential
    (
        p('SONAR_LOGIN := "', "4f1c9e2ab7d05c3e8a6f1b2d9c0e7a3f5b8d2c1e", '"'),
        "4f1c9e2ab7d05c3e8a6f1b2d9c0e7a3f5b8d2c1e",
    ),
    (p('sumologic.accessId = "', "su9OL59biWiJu7", '"'), "su9OL59biWiJu7"),
    # a command-line flag and its value
    (p("run --softlayer-api-key ", "Zq8vT4mL0pX2Wn7Rb5Kc"), "Zq8vT4mL0pX2Wn7Rb5Kc"),
    (p("mysql --password ", "hunter2x9 --user bob"), "hunter2x9"),
]


@pytest.mark.parametrize(("text", "value"), ASSIGNMENTS, ids=range(len(ASSIGNMENTS)))
def test_assignment_form(text: str, value: str) -> None:
    start = text.index(value)
    assert ("SECRET_ASSIGNMENT", start, start + len(value)) in kinds_at(text), (
        f"SECRET_ASSIGNMENT expected at {start}:{start + len(value)}; found {kinds_at(text)}"
    )


NOT_ASSIGNMENTS: list[str] = [
    "curl -i -u 'test:test' https://example.com",
    'curl -sL --user "$1:$2" "$3"',
    "curl -u <user:password> https://test.example.com/endpoint",
    "curl --user neo4j:[PASSWORD] http://localhost:7474/db/data/",
    'curl -u "myusername" http://localhost:15130/api/check_user/',
    "curl -u username:token",
    'curl -u "${username}":"${password}"',
    'curl -u ":" https://localhost:9200',
    'curl --user "xxx:yyy"',
    'curl --user "{{ $.Values.username }}:{{ $.Values.password }}"',
    'curl -X POST --user "$(cat ./login.txt):$(cat ./password.txt)"',
    "curl http://127.0.0.1:5000/file --user user:pass --digest",
    'curl -X GET --insecure --user "username:password"',
    "sort -u names.txt:other",
    "the --token expired yesterday",
    "the --password is required",
    "use --password-file /etc/app/secret",
    "--api-key $API_KEY",
    "sumObj = suGyI5imvADdvU",
    "secret_name = s3cret-Pw2",
]


@pytest.mark.parametrize("text", NOT_ASSIGNMENTS, ids=range(len(NOT_ASSIGNMENTS)))
def test_not_an_assignment(text: str) -> None:
    found = [(s, e) for k, s, e in kinds_at(text) if k == "SECRET_ASSIGNMENT"]
    assert not found, f"SECRET_ASSIGNMENT at {found}"


# --- documented examples and PEM templates -------------------------------------------------------


@pytest.mark.parametrize("value", sorted(DOCUMENTED_EXAMPLES))
def test_documented_examples_are_left_alone(value: str) -> None:
    for text in (f"key {value} here", f'aws_secret_access_key = "{value}"', f"AWS_ACCESS_KEY_ID={value}"):
        start = text.index(value)
        hits = [(k, s, e) for k, s, e in kinds_at(text) if s < start + len(value) and e > start]
        assert not hits, f"a documented example reported as {[k for k, _, _ in hits]}"


def test_a_documented_example_with_one_character_changed_is_a_key() -> None:
    value = next(v for v in sorted(DOCUMENTED_EXAMPLES) if v.startswith("AKIA"))
    changed = value[:-1] + ("F" if value[-1] != "F" else "G")
    assert covered(f"key {changed} here", changed, "AWS_ACCESS_KEY")


@pytest.mark.parametrize(
    "body",
    ["...", "\u2026", "<your private key>", "[redacted]", "{key}", "xxxx", "****"],
)
def test_a_pem_template_is_no_key(body: str) -> None:
    for newline in ("\n", "\\n"):
        text = f"-----BEGIN RSA PRIVATE KEY-----{newline}{body}{newline}-----END RSA PRIVATE KEY-----"
        assert not [k for k, _, _ in kinds_at(text) if k == "PRIVATE_KEY"], repr(body)


def test_a_pem_header_with_any_other_body_or_none_yet_is_a_key() -> None:
    for text in (
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----\nanything\n-----END PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----\n...",
    ):
        assert [k for k, _, _ in kinds_at(text) if k == "PRIVATE_KEY"], repr(text[:40])


# --- the fast path: triggers and anchors lose nothing -------------------------------------------


def test_vendor_detectors_are_token_detectors_and_match_no_whitespace() -> None:
    for detector in VENDOR_DETECTORS:
        assert not matches_space(detector.pattern.pattern), detector.name
        if detector.triggers:
            assert detector.token and detector.min_length >= TOKEN_RUN_MIN, detector.name
        else:
            assert detector.anchor is not None, detector.name


def test_trigger_index_reads_first_words() -> None:
    index = Triggers.build(["hf_", "AKIA", "_live_", "-us", ":AA"], ["@", "-----BEGIN"])
    assert index.exact == {b"hf": frozenset({"hf_"}), b"live": frozenset({"_live_"})}
    assert index.heads == {
        2: {b"us": frozenset({"-us"}), b"AA": frozenset({":AA"})},
        3: {b"AKI": frozenset({"AKIA"})},
    }
    assert [literal for literal, _ in index.plain] == ["-----BEGIN", "@"]
    text = "a long token: " + p("hf", "_", rand(string.ascii_letters, 34)) + " and mail@example.com"
    assert index.present(Scratch(text)) == {"hf_", "@"}
    # Prose has no token runs: token triggers are not looked for there at all.
    assert Triggers.build(["hf_"], []).present(Scratch("hf_ is a prefix, in prose")) == set()


_PIECES = st.sampled_from(
    [
        *(token for _, token in TOKENS[::3]),
        "hf_", "glpat-", "npm_", "-us", ":AA", "Q~", "~", ".", "_", "-", " ", "\n", "=", "x", "AKIA",
        "eyJ", "sk-", "ghp_", "xoxb-", "BUNDLE_", "__COM", "curl -u a:", "Zq8vT4mL0pX2", "é", "0123456789",
    ]
)  # fmt: skip


def _without_fast_path(catalog: Catalog, text: str) -> dict[str, list[tuple[int, int]]]:
    """Every detector run on the whole text, no trigger, requirement or context consulted."""
    scratch = Scratch(text)
    spans: dict[str, list[tuple[int, int]]] = {}
    for detector in catalog.detectors:
        if len(text) >= detector.min_length:
            spans.setdefault(detector.kind, []).extend(catalog._run(detector, text, scratch))
    return {k: engine._merge_overlaps(v) for k, v in spans.items() if v}


@settings(max_examples=example_count(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_the_fast_path_loses_no_finding(text: str) -> None:
    """Triggers looked up in token runs only, and detectors skipped without one: on any text the
    scan finds what running every detector finds."""
    fast = {k: engine._merge_overlaps(v) for k, v in SECRETS._scan(text).items()}
    assert fast == _without_fast_path(SECRETS, text)


@pytest.mark.parametrize(
    "adversarial",
    [
        "curl " * 40_000,
        "curl -u a:" * 20_000,
        "hf_" * 60_000,
        "glpat-" + "a" * 200_000,
        "Q~" * 100_000,
        ":AA" * 60_000,
        "-us" * 60_000,
        "BUNDLE_" + "A__" * 60_000,
        "EAA" * 60_000,
        "--password " * 20_000,
        "-----BEGIN PRIVATE KEY-----" * 7_000,
        ("M" + "A" * 23 + ".") * 8_000,
    ],
    ids=lambda v: repr(v[:6]),
)
def test_large_adversarial_inputs_finish_without_timeout(adversarial: str) -> None:
    # Linear patterns and validators that read a bounded stretch each: 200 KB of repetition
    # completes within the default time budget.
    ALL.detect(adversarial)


def test_every_vendor_detector_is_in_the_catalog_with_its_kind() -> None:
    names = [d.name for d in DETECTORS]
    assert len(names) == len(set(names))
    for detector in VENDOR_DETECTORS:
        assert detector in DETECTORS
        assert detector.kind in SETS["secrets"]


def test_an_api_token_gets_a_token_surrogate_of_its_shape() -> None:
    """`mode: surrogate`: the kind falls to the TOKEN family: the same length and layout, every
    letter and digit another one of its class (the prefix with the rest)."""
    assert family_of("API_TOKEN") == "TOKEN:API_TOKEN"
    for _, token in TOKENS[:12]:
        surrogate = candidate(b"k" * 32, family_of("API_TOKEN"), token, 0)
        assert len(surrogate) == len(token) and surrogate != token
        assert [ch.isdigit() for ch in surrogate] == [ch.isdigit() for ch in token]
