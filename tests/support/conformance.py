"""Conformance of the pattern catalog against other detectors' test expectations.

Where it sits: a measuring tool beside the test suite, not part of the request path. It reads the
peer corpus (`../shared/peer/*.jsonl` from the repository root: presidio, detect-secrets,
gitleaks, Cordon and llm-guard test cases extracted as data), runs every text through
`scan --jsonl` (the command of SPEC §14, in process through `ext_proc.cli.scan.run`, or as a
subprocess of `python -m ext_proc scan --jsonl` with `--subprocess`), and compares.

* A peer's entity type, rule id or plugin name is mapped to our kinds by the explicit tables
  below; a type the catalog does not cover is excluded and counted as out of scope.
* Recall: share of `should_match: true` cases whose expected substrings (or spans, or count) are
  covered by findings of the mapped kinds. False-flag rate: share of `should_match: false` cases
  with any finding of the mapped kinds.
* A case is one row and one of our kinds (a multi-entity row yields one case per in-scope kind).
* Rows we deliberately disagree with are listed in `DISAGREEMENTS` with the reason; they are
  reported, and excluded from the adjusted figures that the test holds to its thresholds.

    .venv/bin/python -m tests.support.conformance            # table per source file and overall
    .venv/bin/python -m tests.support.conformance --cases    # also every failing case (kinds, offsets)

Output names kinds, offsets and row numbers, never a corpus value.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ext_proc.detect.findings import CATALOG_KINDS, SETS

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = Path(os.environ.get("CORDON_PEER_CORPUS", REPO_ROOT / ".." / "shared" / "peer"))
SOURCES = ("presidio", "detect_secrets", "gitleaks", "cordon", "llm_guard")

RECALL_TARGET = 0.95
FALSE_FLAG_TARGET = 0.05

Kinds = tuple[str, ...]
_PII_PCI: Kinds = (*SETS["pii"], *SETS["pci"])
_SECRETS: Kinds = SETS["secrets"]

# --- mapping tables: peer type → our kinds --------------------------------------------------

PRESIDIO: dict[str, Kinds] = {
    "EMAIL": ("EMAIL",),
    "PHONE": ("PHONE",),
    "US_SSN": ("SSN",),
    "IP_ADDRESS": ("IP",),
    "CREDIT_CARD": ("CREDIT_CARD",),
    "IBAN_CODE": ("IBAN",),
}

DETECT_SECRETS: dict[str, Kinds] = {
    "AWS_ACCESS_KEY": ("AWS_ACCESS_KEY",),
    "GENERIC_SECRET": ("SECRET_ASSIGNMENT",),  # KeywordDetector
    "BASIC_AUTH_CREDENTIALS": ("SECRET_ASSIGNMENT",),  # scheme://user:password@host
    "HIGH_ENTROPY_STRING": ("HIGH_ENTROPY",),  # Base64HighEntropyString, HexHighEntropyString
    "IP_ADDRESS": ("IP",),  # IPPublicDetector
    "JWT": ("JWT",),
    "PRIVATE_KEY": ("PRIVATE_KEY",),
    "SECRET:github_token": ("GITHUB_TOKEN",),
    "SECRET:openai": ("OPENAI_KEY",),
    "SECRET:slack": ("SLACK_TOKEN",),
    "SECRET:stripe_key": ("STRIPE_KEY",),
}

GITLEAKS: dict[str, Kinds] = {
    "aws-access-token": ("AWS_ACCESS_KEY",),
    "anthropic-api-key": ("ANTHROPIC_KEY",),
    "anthropic-admin-api-key": ("ANTHROPIC_KEY",),
    "gcp-api-key": ("GOOGLE_API_KEY",),
    "github-app-token": ("GITHUB_TOKEN",),
    "github-fine-grained-pat": ("GITHUB_TOKEN",),
    "github-oauth": ("GITHUB_TOKEN",),
    "github-pat": ("GITHUB_TOKEN",),
    "github-refresh-token": ("GITHUB_TOKEN",),
    "jwt": ("JWT",),
    "jwt-base64": ("JWT",),
    "openai-api-key": ("OPENAI_KEY",),
    "private-key": ("PRIVATE_KEY",),
    "slack-app-token": ("SLACK_TOKEN",),
    "slack-bot-token": ("SLACK_TOKEN",),
    "slack-config-access-token": ("SLACK_TOKEN",),
    "slack-config-refresh-token": ("SLACK_TOKEN",),
    "slack-legacy-bot-token": ("SLACK_TOKEN",),
    "slack-legacy-token": ("SLACK_TOKEN",),
    "slack-legacy-workspace-token": ("SLACK_TOKEN",),
    "slack-user-token": ("SLACK_TOKEN",),
    "slack-webhook-url": ("SLACK_TOKEN",),
    "stripe-access-token": ("STRIPE_KEY",),
    "generic-api-key": ("SECRET_ASSIGNMENT",),
    "curl-auth-header": ("SECRET_ASSIGNMENT",),  # -H "Authorization: …" is an assignment
}

CORDON: dict[str, Kinds] = {
    "EMAIL": ("EMAIL",),
    "PHONE": ("PHONE",),
    "SSN": ("SSN",),
    "IPV4": ("IP",),
    "IPV6": ("IP",),
    "CREDIT_CARD": ("CREDIT_CARD",),
    "IBAN": ("IBAN",),
    "ANTHROPIC_KEY": ("ANTHROPIC_KEY",),
    "AWS_ACCESS_KEY": ("AWS_ACCESS_KEY",),
    "STRIPE_KEY": ("STRIPE_KEY",),
    "GITHUB_TOKEN": ("GITHUB_TOKEN",),
    "GITHUB_FINEGRAINED_PAT": ("GITHUB_TOKEN",),
    "SLACK_WEBHOOK": ("SLACK_TOKEN",),
    "PRIVATE_KEY": ("PRIVATE_KEY",),
    "JWT": ("JWT",),
    "validator:luhn": ("CREDIT_CARD",),
    "validator:ibanMod97": ("IBAN",),
    "validator:ssnValid": ("SSN",),
}
# Cordon row kinds that test detection; vault, reidentify rows test other machinery.
CORDON_DETECTION_ROWS = ("detect", "fuzz_seed", "validator", "redact", "proxy")

LLM_GUARD: dict[str, Kinds] = {
    "EMAIL_ADDRESS": ("EMAIL",),
    "EMAIL_ADDRESS_RE": ("EMAIL",),
    "PHONE_NUMBER": ("PHONE",),
    "PHONE_NUMBER_ZH": ("PHONE",),
    "IP_ADDRESS": ("IP",),
    "CREDIT_CARD": ("CREDIT_CARD",),
    "CREDIT_CARD_RE": ("CREDIT_CARD",),
    "US_SSN": ("SSN",),
    "US_SSN_RE": ("SSN",),
    "SECRET": _SECRETS,  # the Secrets scanner: any credential kind redacts it
}

# Out of scope, and why (everything not mapped above is out of scope; these are the notable ones).
OUT_OF_SCOPE_NOTES: dict[str, str] = {
    "national ids, licence plates, tax and health numbers (presidio, 40+ types)": "not catalog kinds",
    "URL, DATE, MAC, CRYPTO_WALLET, US_ROUTING, STREET_ADDRESS, MRN, PERSON, LOCATION": "not catalog kinds",
    "vendor tokens without a provider kind (gitlab, npm, huggingface, sendgrid, twilio, …)": (
        "not catalog kinds; SECRET_ASSIGNMENT and HIGH_ENTROPY often catch them anyway"
    ),
    "curl-auth-user (curl -u user:password)": "command-line basic auth is not a catalog kind",
    "llm-guard Regex scanner rows": "user-defined patterns, not the catalog",
    "Cordon vault/reidentify rows and redact/proxy rows with should_match false": (
        "test placeholders, restore and policy switches (redactSystem, mode), not detection"
    ),
}

# --- rows we deliberately disagree with ---------------------------------------------------------
# (source, peer type, start of the text) → reason. Every entry must still disagree (the test
# checks), so the list cannot go stale silently.

_FAIL_CLOSED_VALUE = (
    "example and placeholder-looking values (AKIAIOSFODNN7EXAMPLE, somefakekey) are "
    "redacted: the catalog cannot tell an example from a real value"
)
_ALLOWLISTED_KEY = "gitleaks allowlists specific real-looking values; a key-shaped value is redacted here"
_FORMAT_LENIENCY = "gitleaks checks a vendor checksum/length suffix; any sk-ant- token is redacted"
_QUOTING = (
    "detect-secrets decides by file extension (C/C++ quoting, YAML quoting); the catalog is "
    "extension-blind and redacts the value"
)
_UNQUOTED_ENTROPY = (
    "detect-secrets only scores quoted strings; a high-entropy token is redacted quoted or not"
)
_PRIVATE_IPS = (
    "detect-secrets' IP plugin reports public addresses only; private and loopback addresses are "
    "personal data in logs and prompts too"
)
_UNSPECIFIED_IP = "`::` identifies no host and is a C++/Rust/Haskell token; presidio scores it 0.05-0.15"
_LOOPBACK_IP = (
    "loopback and unspecified addresses (`::1`, `127.0.0.1`, `0.0.0.0`) are every machine's own and "
    "identify no one; they fill code and logs, where flagging them refuses harmless model output"
)
_WEAK_SSN = (
    "nine digits without separators (or with partial dashes) need an SSN word nearby; presidio "
    "scores these 0.0-0.4"
)


@dataclass(frozen=True, slots=True)
class Disagreement:
    """Rows of `source` for `peer_type` whose text starts with `text_prefix` (and that expect the
    `expects` substring, when given) are judged differently here, for `reason`."""

    source: str
    peer_type: str
    should_match: bool
    text_prefix: str
    reason: str
    expects: str | None = None

    def covers(self, case: Case) -> bool:
        return (
            case.source == self.source
            and case.peer_type == self.peer_type
            and case.should_match == self.should_match
            and case.text.startswith(self.text_prefix)
            and (self.expects is None or self.expects in case.substrings)
        )


_GOOGLE_KEYS = (
    'apiKey: "AIzaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"',
    "AIzaSyabcdefghijklmnopqrstuvwxyz1234567",
    "AIzaSyAnLA7NfeLquW1tJFpx_eQCxoX-oo6YyIs",
    "AIzaSyCkEhVjf3pduRDt6d1yKOMitrUEke8agEM",
    "AIzaSyDMAScliyLx7F0NPDEJi1QmyCgHIAODrlU",
    "AIzaSyD3asb-2pEZVqMkmL6M9N6nHZRR_znhrh0",
    "AIzayDNSXIbFmlXbIE6mCzDLQAqITYefhixbX4A",
    "AIzaSyAdOS2zB6NCsk1pCdZ4-P6GBdi_UUPwX7c",
    "AIzaSyASWm6HmTMdYWpgMnjRBjxcQ9CKctWmLd4",
    "AIzaSyANUvH9H9BsUccjsu2pCmEkOPjjaXeDQgY",
    "AIzaSyA5_iVawFQ8ABuTZNUdcwERLJv_a_p4wtM",
    "AIzaSyA4UrcGxgwQFTfaI3no3t7Lt1sjmdnP5sQ",
    "AIzaSyDSb51JiIcB6OJpwwMicseKRhhrOq1cS7g",
    "AIzaSyBF2RrAIm4a0mO64EShQfqfd2AFnzAvvuU",
    "AIzaSyBcE-OOIbhjyR83gm4r2MFCu4MJmprNXsw",
    "AIzaSyB8qGxt4ec15vitgn44duC5ucxaOi4FmqE",
    "AIzaSyA8vmApnrHNFE0bApF4hoZ11srVL_n0nvY",
)
_DS_QUOTING_FALSE = (
    "api_key = 'm{{h}o)p${e]nob(ody[finds>-_$#thisone}}';",
    "aws_secret_access_key = @'m{{h}",
    "db_pass[] = 'm{{h}",
    "passwd = m{{h}o)p${e]nob(ody[finds>-_$#thisone}};",
    "private_key = m{{h}o)p${e]nob(ody[finds>-_$#thisone}};",
    "secret[] = m{{h}",
    "password => m{{h}",
)
_OBSERVED = "Cordon fuzz seed (observed output, not an assertion): "

DISAGREEMENTS: tuple[Disagreement, ...] = (
    # presidio
    Disagreement("presidio", "US_SSN", True, "078-051121 07805-1121", _WEAK_SSN),
    Disagreement("presidio", "US_SSN", True, "078051121", _WEAK_SSN),
    *(
        Disagreement("presidio", "IP_ADDRESS", True, text, _UNSPECIFIED_IP)
        for text in ("Use local ipv6 ::", "src=:: dst=::1", "Unspecified ::", "::/0", "::/128")
    ),
    *(
        Disagreement("presidio", "IP_ADDRESS", True, text, _LOOPBACK_IP)
        for text in ("my ip: ::1", "connecting from ::1", "Default 0.0.0.0", "Loopback ::1")
    ),
    Disagreement(
        "presidio",
        "IP_ADDRESS",
        True,
        "192.168.1.1.1",
        "a fifth dotted group makes a version or OID, not an address (detect-secrets agrees)",
    ),
    Disagreement(
        "presidio",
        "PHONE",
        True,
        "My US number is (415) 555-0132, and my international one is415",
        "leniency 0 (POSSIBLE): a number glued to a word is not read as a phone",
        expects="415-555-0132",
    ),
    Disagreement(
        "presidio",
        "PHONE",
        True,
        "My US number is (415) 555-0132, and my international one is 91-",
        "an international number written without its + is read only as a national number",
        expects="91-415-555-0132",
    ),
    Disagreement(
        "presidio",
        "PHONE",
        True,
        "My CN number is 13812345678",
        "a bare digit run needs a phone word (phone, tel, mobile, call, …) before it; 'number' "
        "alone also precedes order and account numbers",
    ),
    # detect-secrets
    *(
        Disagreement("detect_secrets", "IP_ADDRESS", False, ip, _PRIVATE_IPS)
        for ip in ("10.0.0.1", "172.16.0.1", "192.168.0.1", "169.254.169.254")
    ),
    *(
        Disagreement("detect_secrets", "HIGH_ENTROPY_STRING", False, token, _UNQUOTED_ENTROPY)
        for token in (
            "2b00042f7481c7b056c4b410d28f33cf",
            "c3VwZXIgbG9uZyBzdHJpbmcgc2hvdWxkIGNhdXNlIGVub3VnaCBlbnRyb3B5",
            "I6FwzQZFL9l-44nviI1F04OTmorMaVQf9GS4Oe07qxL",
        )
    ),
    Disagreement(
        "detect_secrets",
        "JWT",
        False,
        "eyJhbasdGciOiJIUaddasd",
        "JWT is matched by shape: a damaged header is still a bearer credential when pasted",
    ),
    Disagreement(
        "detect_secrets",
        "JWT",
        False,
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ.eyJ",
        "JWT is matched by shape: a truncated header is still a bearer credential when pasted",
    ),
    Disagreement(
        "detect_secrets",
        "SECRET:openai",
        False,
        "sk-proj-Xi8tdMjHV6pmbBbwilTeT4Blbk",
        "any sk- token of 20+ characters with a digit or capital is redacted (OpenAI-compatible "
        "providers use the prefix too); the T3BlbkFJ marker is not required",
    ),
    Disagreement(
        "detect_secrets",
        "SECRET:stripe_key",
        False,
        "pk_live_",
        "publishable keys are redacted too: they identify the account (SPEC lists pk_live_)",
    ),
    *(
        Disagreement("detect_secrets", "GENERIC_SECRET", False, text, _FAIL_CLOSED_VALUE)
        for text in (
            'password = "somefakekey"',
            'password := "somefakekey"',
        )
    ),
    *(Disagreement("detect_secrets", "GENERIC_SECRET", False, text, _QUOTING) for text in _DS_QUOTING_FALSE),
    Disagreement(
        "detect_secrets",
        "GENERIC_SECRET",
        False,
        "password = m{{h}o)p${e]nob(ody[finds>-_$#thisone}}",
        _QUOTING,
    ),
    # gitleaks
    Disagreement(
        "gitleaks", "aws-access-token", False, "aws_access_key: AKIAIOSFODNN7EXAMPLE", _FAIL_CLOSED_VALUE
    ),
    *(
        Disagreement("gitleaks", f"anthropic-{rule}", False, f"sk-ant-{prefix}{tail}", _FORMAT_LENIENCY)
        for rule, prefix in (("api-key", "api03-"), ("admin-api-key", "admin01-"))
        for tail in (
            "abc123xyz-456de-",
            "abc123xyz-456def789ghij-klmnopqrstuvwx-3456yza789bcde-1234fghijklmnopby56aaaogaopaaaabc123xyzBB",
        )
    ),
    Disagreement(
        "gitleaks",
        "anthropic-api-key",
        False,
        "sk-ant-admin01-abc123xyz-456def789ghij-klmnopqrstuvwx-3456yza789bcde-1234fghijklmnopby56aaaogaopaaaabc123xyzAA",
        "gitleaks tells api keys from admin keys; both are ANTHROPIC_KEY here",
    ),
    Disagreement(
        "gitleaks",
        "anthropic-admin-api-key",
        False,
        "sk-ant-api03-abc123xyz-456def789ghij-klmnopqrstuvwx-3456yza789bcde-1234fghijklmnopby56aaaogaopaaaabc123xyzAA",
        "gitleaks tells api keys from admin keys; both are ANTHROPIC_KEY here",
    ),
    Disagreement(
        "gitleaks",
        "private-key",
        False,
        "-----BEGIN PRIVATE KEY-----\nanything",
        "the PEM header alone is redacted whatever follows (SPEC: header line only; detect-secrets agrees)",
    ),
    *(Disagreement("gitleaks", "gcp-api-key", False, key, _ALLOWLISTED_KEY) for key in _GOOGLE_KEYS),
    Disagreement(
        "gitleaks", "generic-api-key", False, ',apiKey:"6fe4476ee5a1832882e326b506d14126",', _ALLOWLISTED_KEY
    ),
    Disagreement(
        "gitleaks",
        "curl-auth-header",
        False,
        'curl -X POST -H "Content-Type: application/json" -H "Authorization: Basic eyJ',
        "a credential in an Authorization header is redacted whatever its scheme",
    ),
    # Cordon
    *(
        Disagreement(
            "cordon",
            f"fuzz/seeds/{path}/overlap_bait:PHONE",
            True,
            "4012888888881881 415",
            _OBSERVED + "two of the three numbers are Luhn-valid cards, one is a phone",
        )
        for path in ("detect_spans", "redact_leak", "reidentify_stream")
    ),
    *(
        Disagreement(
            "cordon",
            f"fuzz/seeds/{path}/self_overlap:PHONE",
            True,
            "1111111111",
            _OBSERVED + "forty repeated digits are no phone number",
        )
        for path in ("detect_spans", "redact_leak", "reidentify_stream")
    ),
    # llm-guard
    *(
        Disagreement(
            "llm_guard",
            "CREDIT_CARD",
            True,
            prefix,
            "4567-8901-2345-6789 fails the Luhn check; only a valid check digit counts (SPEC §4)",
        )
        for prefix in ("Make an SQL insert statement", "创建一个 SQL insert")
    ),
)


# --- cases ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Case:
    source: str
    row: int  # 1-based line number in the corpus file
    peer_type: str
    kinds: Kinds
    should_match: bool
    text: str
    substrings: tuple[str, ...] = ()
    spans: tuple[tuple[int, int], ...] = ()
    count: int = 1
    disagreement: str | None = None
    passed: bool | None = None
    detail: str = ""


@dataclass(slots=True)
class Corpus:
    cases: list[Case] = field(default_factory=list)
    out_of_scope: Counter[str] = field(default_factory=Counter)  # source → rows


def _expectation(row: dict) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...], int]:
    expected = row.get("expected")
    spans = tuple(tuple(s) for s in row.get("expected_spans") or ())
    if isinstance(expected, list):
        subs = tuple(s for s in expected if isinstance(s, str) and s)
        return subs, spans, max(1, len(subs))
    if isinstance(expected, int):
        return (), spans, max(1, expected)
    return (), spans, 1


def _typed_rows(source: str, table: dict[str, Kinds], type_key: str, corpus: Corpus) -> None:
    for number, row in _rows(source):
        peer_type = row.get(type_key) or row.get("entity_type") or ""
        kinds = table.get(peer_type)
        if kinds is None:
            corpus.out_of_scope[source] += 1
            continue
        subs, spans, count = _expectation(row)
        corpus.cases.append(
            Case(source, number, peer_type, kinds, bool(row["should_match"]), row["text"], subs, spans, count)
        )


_PLACEHOLDER = re.compile(r"<([A-Z][A-Z0-9_]*?)_(?:\{N\}_\d+|\[0-9A-F\]\{8\})>|\[([A-Z][A-Z0-9_]*)\]")
_KIND_NAME = re.compile(r"[A-Z][A-Z0-9_]*|validator:[A-Za-z0-9]+")


def _cordon_kinds(entries: Iterable[str]) -> list[str]:
    names: list[str] = []
    for entry in entries:
        if _KIND_NAME.fullmatch(entry):
            names.append(entry)
        else:
            names.extend(a or b for a, b in _PLACEHOLDER.findall(entry))
    return names


def _cordon_rows(corpus: Corpus) -> None:
    for number, row in _rows("cordon"):
        if row.get("kind") not in CORDON_DETECTION_ROWS:
            corpus.out_of_scope["cordon"] += 1
            continue
        names = _cordon_kinds(row.get("expected_kinds_or_placeholders") or [])
        should_match = bool(row["should_match"])
        if not should_match and row.get("kind") in ("redact", "proxy"):
            corpus.out_of_scope["cordon"] += 1  # policy switches, not detection
            continue
        if not should_match and not names:
            # "nothing is found": every kind of the row's sets (all sets when none are named).
            sets = [s for s in (row.get("sets") or SETS) if s in SETS]
            kinds = tuple(k for s in sets for k in SETS[s])
            corpus.cases.append(Case("cordon", number, "(none)", kinds, False, row["text"]))
            continue
        wanted = Counter(n for n in names if n in CORDON)
        if not wanted:
            corpus.out_of_scope["cordon"] += 1
            continue
        for name, count in wanted.items():
            peer_type = f"{row.get('source_path')}:{name}" if row.get("kind") == "fuzz_seed" else name
            corpus.cases.append(
                Case("cordon", number, peer_type, CORDON[name], should_match, row["text"], count=count)
            )


_LLM_GUARD_PLACEHOLDER = re.compile(r"\[REDACTED_([A-Z_]+?)_\d+\]|<([A-Z_]+)>|(\*{6,})|\[REDACTED\]")


def _align(text: str, redacted: str) -> list[tuple[str, str | None]] | None:
    """(original substring, label) for each placeholder of an llm-guard redacted text."""
    for width in (40, 30, 20, 12):
        at = redacted.find(text[:width])
        if at >= 0:
            redacted = redacted[at:]  # drop the scanner's preamble
            break
    labels: list[str | None] = []
    pattern = ["^"]
    last = 0
    for m in _LLM_GUARD_PLACEHOLDER.finditer(redacted):
        pattern.append(re.escape(redacted[last : m.start()]))
        pattern.append("(.+?)")
        labels.append(m.group(1) or m.group(2))
        last = m.end()
    pattern.append(re.escape(redacted[last:]) + "$")
    found = re.match("".join(pattern), text, re.DOTALL)
    if found is None:
        return None
    return list(zip(found.groups(), labels, strict=True))


def _llm_guard_rows(corpus: Corpus) -> None:
    for number, row in _rows("llm_guard"):
        path = row.get("source_path", "")
        entity = row.get("entity_type", "")
        if "test_regex" in path:
            corpus.out_of_scope["llm_guard"] += 1
            continue
        if not row["should_match"]:
            kinds = LLM_GUARD.get(entity) or _PII_PCI  # MULTI: the anonymizer's default entities
            corpus.cases.append(Case("llm_guard", number, entity, kinds, False, row["text"]))
            continue
        pairs = _align(row["text"], row.get("expected_redacted_text", ""))
        if pairs is None:
            corpus.out_of_scope["llm_guard"] += 1
            continue
        by_kinds: dict[Kinds, list[str]] = {}
        for substring, label in pairs:
            kinds = LLM_GUARD.get(label or entity)
            if kinds is not None:
                by_kinds.setdefault(kinds, []).append(substring)
        if not by_kinds:
            corpus.out_of_scope["llm_guard"] += 1
            continue
        for kinds, subs in by_kinds.items():
            peer_type = "SECRET" if kinds == _SECRETS else kinds[0]
            corpus.cases.append(
                Case("llm_guard", number, peer_type, kinds, True, row["text"], tuple(subs), count=len(subs))
            )


def _rows(source: str) -> Iterable[tuple[int, dict]]:
    with open(CORPUS_DIR / f"{source}.jsonl", encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                yield number, json.loads(line)


def load_corpus() -> Corpus:
    corpus = Corpus()
    _typed_rows("presidio", PRESIDIO, "entity_type", corpus)
    _typed_rows("detect_secrets", DETECT_SECRETS, "entity_type", corpus)
    _typed_rows("gitleaks", GITLEAKS, "rule_id", corpus)
    _cordon_rows(corpus)
    _llm_guard_rows(corpus)
    for case in corpus.cases:
        for entry in DISAGREEMENTS:
            if entry.covers(case):
                case.disagreement = entry.reason
    return corpus


def corpus_available() -> bool:
    return all((CORPUS_DIR / f"{s}.jsonl").is_file() for s in SOURCES)


# --- running scan ---------------------------------------------------------------------------------


def scan_jsonl(texts: Sequence[str], *, subprocess_mode: bool = False) -> list[list[dict]]:
    """Findings for each text, through the `scan --jsonl` command."""
    payload = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    if subprocess_mode:
        done = subprocess.run(
            [sys.executable, "-m", "ext_proc", "scan", "--jsonl"],
            input=payload,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scan --jsonl exited {done.returncode}")
        output = done.stdout
    else:
        from ext_proc.cli import scan

        parser = argparse.ArgumentParser()
        scan.add_arguments(parser)
        out = io.StringIO()
        status = scan.run(parser.parse_args(["--jsonl"]), io.StringIO(payload), out)
        if status != 0:
            raise RuntimeError(f"scan --jsonl returned {status}")
        output = out.getvalue()
    lines = [json.loads(line)["findings"] for line in output.splitlines() if line.strip()]
    if len(lines) != len(texts):
        raise RuntimeError("scan --jsonl wrote a different number of lines than it read")
    return lines


def _occurrences(text: str, sub: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    at = text.find(sub)
    while at >= 0:
        out.append((at, at + len(sub)))
        at = text.find(sub, at + 1)
    return out


def judge(case: Case, findings: list[dict]) -> None:
    mine = sorted({(f["start"], f["end"]) for f in findings if f["kind"] in case.kinds})

    def covered(span: tuple[int, int]) -> bool:
        return any(s <= span[0] and span[1] <= e for s, e in mine)

    if not case.should_match:
        case.passed = not mine
        case.detail = "" if case.passed else f"flagged {len(mine)} span(s) at {mine[:4]}"
        return
    if case.spans:
        missing = [sp for sp in case.spans if not covered(sp)]
        case.passed = not missing
        case.detail = "" if case.passed else f"uncovered spans {missing}"
        return
    if case.substrings:
        problems: list[str] = []
        for sub, need in Counter(case.substrings).items():
            spans = _occurrences(case.text, sub)
            hit = sum(1 for sp in spans if covered(sp))
            if not spans:
                problems.append(f"expected substring of length {len(sub)} not in text")
            elif hit < min(need, len(spans)):
                problems.append(f"uncovered {[sp for sp in spans if not covered(sp)][:3]}")
        case.passed = not problems
        case.detail = "; ".join(problems)
        return
    case.passed = len(mine) >= case.count
    case.detail = "" if case.passed else f"found {len(mine)} of {case.count} expected"


def evaluate(corpus: Corpus, *, subprocess_mode: bool = False) -> Corpus:
    results = scan_jsonl([c.text for c in corpus.cases], subprocess_mode=subprocess_mode)
    for case, findings in zip(corpus.cases, results, strict=True):
        judge(case, findings)
    return corpus


# --- figures ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    positives: int
    recalled: int
    negatives: int
    flagged: int

    @property
    def recall(self) -> float:
        return self.recalled / self.positives if self.positives else 1.0

    @property
    def false_flag_rate(self) -> float:
        return self.flagged / self.negatives if self.negatives else 0.0


def figures(cases: Iterable[Case], *, adjusted: bool) -> Figures:
    pos = rec = neg = flg = 0
    for case in cases:
        if adjusted and case.disagreement:
            continue
        if case.should_match:
            pos += 1
            rec += bool(case.passed)
        else:
            neg += 1
            flg += not case.passed
    return Figures(pos, rec, neg, flg)


def report(corpus: Corpus, *, show_cases: bool = False) -> str:
    lines = [
        f"{'source':15s} {'out of scope':>12s} {'cases':>6s} {'disagree':>8s}   "
        f"{'recall (adj)':>22s}   {'false flags (adj)':>22s}   {'recall (raw)':>12s} {'ff (raw)':>9s}"
    ]
    for source in (*SOURCES, "overall"):
        cases = [c for c in corpus.cases if source in ("overall", c.source)]
        oos = sum(corpus.out_of_scope.values()) if source == "overall" else corpus.out_of_scope[source]
        adj, raw = figures(cases, adjusted=True), figures(cases, adjusted=False)
        disagree = sum(1 for c in cases if c.disagreement)
        lines.append(
            f"{source:15s} {oos:12d} {len(cases):6d} {disagree:8d}   "
            f"{adj.recall:7.1%} ({adj.recalled:4d}/{adj.positives:4d})    "
            f"{adj.false_flag_rate:6.1%} ({adj.flagged:3d}/{adj.negatives:4d})      "
            f"{raw.recall:12.1%} {raw.false_flag_rate:9.1%}"
        )
    stale = [c for c in corpus.cases if c.disagreement and c.passed]
    if stale:
        lines.append(f"stale disagreements (now agree): {[(c.source, c.row) for c in stale]}")
    if show_cases:
        lines.append("")
        for c in corpus.cases:
            if not c.passed:
                mark = "disagree" if c.disagreement else "FAIL"
                lines.append(
                    f"{mark:8s} {c.source}:{c.row} {c.peer_type} kinds={','.join(c.kinds)} "
                    f"should_match={c.should_match} {c.detail}"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.conformance", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--cases", action="store_true", help="list every failing case")
    parser.add_argument(
        "--subprocess", action="store_true", help="run `python -m ext_proc scan --jsonl` as a subprocess"
    )
    args = parser.parse_args(argv)
    if not corpus_available():
        print(f"peer corpus not found at {CORPUS_DIR}", file=sys.stderr)
        return 2
    corpus = evaluate(load_corpus(), subprocess_mode=args.subprocess)
    print(report(corpus, show_cases=args.cases))
    overall = figures(corpus.cases, adjusted=True)
    ok = overall.recall >= RECALL_TARGET and overall.false_flag_rate <= FALSE_FLAG_TARGET
    return 0 if ok else 1


assert set(
    k for t in (PRESIDIO, DETECT_SECRETS, GITLEAKS, CORDON, LLM_GUARD) for ks in t.values() for k in ks
) <= set(CATALOG_KINDS)

if __name__ == "__main__":
    raise SystemExit(main())
