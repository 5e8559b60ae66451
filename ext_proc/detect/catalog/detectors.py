"""The detectors of the catalog, as data: one frozen `Detector` per pattern.

A detector names its kind, its compiled pattern, the capture group that is the value, the
validator (in `VALIDATORS`) a match must pass, and its fast path: the conditions without which
it cannot match, which let `Catalog.detect` skip it or scan only the windows its anchor (in
`ANCHORS`) returns. Adding a pattern to the catalog is adding an entry to `DETECTORS` (a vendor
token's, to `vendors.VENDOR_DETECTORS`). `DOCUMENTED_EXAMPLES` are published example
credentials the engine drops from the findings of the secrets kinds.
"""

from __future__ import annotations

from ext_proc.detect.catalog.anchors import SECRET_KEYWORDS
from ext_proc.detect.catalog.entropy import HIGH_ENTROPY_MIN_LENGTH
from ext_proc.detect.catalog.model import MIN_FINDING_LENGTH, Detector, Requirement
from ext_proc.detect.catalog.regexes import DIGITS, compile_pattern
from ext_proc.detect.catalog.vendors import VENDOR_DETECTORS

__all__ = ["DETECTORS", "DOCUMENTED_EXAMPLES", "MIN_FINDING_LENGTH", "Detector", "Requirement"]

AWS_KEY_ID_PREFIXES = (
    "AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "APKA", "A3T",
)  # fmt: skip

# Published example credentials, not anyone's secret: written in documentation, tutorials and the
# answers a model gives about them, and never valid. A finding of a secrets kind that is exactly
# one of these is dropped. Source: AWS's documentation (the access key pairs of its IAM and CLI
# configuration examples).
DOCUMENTED_EXAMPLES: frozenset[str] = frozenset(
    {
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "AKIAI44QH8DHBEXAMPLE",
        "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
    }
)

_KEY = r"(?P<key>-{0,2}[A-Za-z_][A-Za-z0-9_.\-]{0,63})"
# Every repetition is bounded, so a match is at most `anchors.KEY_WINDOW` characters long and the
# windows of the `keyword_identifiers` anchor can hold any of them.
_ASSIGNMENT = compile_pattern(
    r"(?<![A-Za-z0-9_.])" + _KEY + r"(?:\[[^\]\n]{0,16}\])?(?:\\?[\"'`])?[ \t]{0,64}"
    r"(?:(?P<op>:::?=|\?=|:=|=>|===?|!==?|=|:|[ \t]is:?(?=[ \t]))[ \t]{0,64}@?"
    # "api_token", "value": a key and its value as arguments (getenv("api_token", "…"))
    r"|(?<=[\"'`][ \t]{0,64})(?P<comma>,)[ \t]{0,64}(?=\\?[\"'`])"
    r"|(?P<call>\()[ \t]{0,64}(?=\\?[\"'`])"  # secret("value")
    r"|(?<=[A-Za-z0-9_][ \t]{1,64})(?=\\?[\"'`])"  # password "value"
    r"|(?<=(?<!\S)--[A-Za-z][A-Za-z0-9_.\-]{0,62}[ \t]{1,64})(?=[^\s\"'`\-]))"  # --api-key value
    r"(?P<scheme>(?i:bearer|basic|token|digest|api-?token|api-?key|bot|oauth|jwt|ssws)[ \t]{1,8})?"
    r"(?:\\\"(?P<esc>(?:[^\"\\\n]|\\[^\"\n]){1,1024})\\\""
    r"|\"(?P<dq>(?:[^\"\\\n]|\\.){1,1024})\""
    r"|'(?P<sq>(?:[^'\\\n]|\\.){1,1024})'"
    r"|`(?P<bq>[^`\n]{1,1024})`"
    r"|(?P<bare>[^\s\"'`]{1,256}))"
)
_KEY_ONLY = compile_pattern(r"(?<![A-Za-z0-9_.])(?P<key>[A-Za-z_][A-Za-z0-9_.\-]{0,63})(?![A-Za-z0-9_.\-])")

DETECTORS: tuple[Detector, ...] = (
    Detector(
        "pem_private_key_header",
        "PRIVATE_KEY",
        compile_pattern(r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----"),
        validator="private_key",
        triggers=("-----BEGIN",),
    ),
    Detector(
        "jwt",
        "JWT",
        compile_pattern(
            r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{7,}+\.ey[A-Za-z0-9_\-]{8,}+(?:\.[A-Za-z0-9_\-]*+)?"
        ),
        triggers=("eyJ",),
        token=True,
    ),
    Detector(
        "anthropic_key",
        "ANTHROPIC_KEY",
        compile_pattern(r"(?<![A-Za-z0-9_\-])sk-ant-(?P<body>[A-Za-z0-9_\-]{20,}+)"),
        validator="token_body",
        triggers=("sk-ant-",),
        token=True,
    ),
    Detector(
        "openai_key",
        "OPENAI_KEY",
        compile_pattern(
            r"(?<![A-Za-z0-9_\-])sk-(?!ant-)(?:(?:proj|svcacct|admin|None)-)?(?P<body>[A-Za-z0-9_\-]{20,}+)"
        ),
        validator="openai_key",
        triggers=("sk-",),
        token=True,
    ),
    Detector(
        "github_token",
        "GITHUB_TOKEN",
        compile_pattern(
            r"(?<![A-Za-z0-9_])(?:gh[pousr]_(?P<body>[A-Za-z0-9]{36,251})"
            r"|github_pat_(?P<pat>[A-Za-z0-9_]{36,244}))(?![A-Za-z0-9_])"
        ),
        validator="token_body",
        triggers=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        token=True,
    ),
    Detector(
        "slack_token",
        "SLACK_TOKEN",
        compile_pattern(
            r"(?<![A-Za-z0-9])(?:xox[a-z]\.xox[a-z]-[0-9]-[A-Za-z0-9]{60,}"
            r"|xoxe-[0-9]-[A-Za-z0-9]{60,}"
            r"|xox[a-z]-(?:[0-9]-)?[0-9]{6,}-(?:[0-9]{6,}-){0,3}[A-Za-z0-9]{8,}"
            r"|xapp-[0-9]-[A-Z0-9]{9,}-[0-9]{6,}-[A-Za-z0-9]{20,})(?![A-Za-z0-9\-])"
        ),
        triggers=("xox", "xapp-"),
        token=True,
    ),
    Detector(
        "slack_webhook",
        "SLACK_TOKEN",
        compile_pattern(r"https?://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/+\-]{16,}"),
        triggers=("hooks.slack.com",),
        token=True,
    ),
    Detector(
        "stripe_key",
        "STRIPE_KEY",
        compile_pattern(
            r"(?<![A-Za-z0-9_])[spr]k_(?:live|test|prod)_(?P<body>[A-Za-z0-9]{10,247})(?![A-Za-z0-9_])"
        ),
        validator="token_body",
        triggers=("_live_", "_test_", "_prod_"),
        token=True,
    ),
    Detector(
        "google_api_key",
        "GOOGLE_API_KEY",
        compile_pattern(r"(?<![A-Za-z0-9_\-])AIza(?P<body>[0-9A-Za-z_\-]{35})(?![A-Za-z0-9_\-])"),
        validator="token_body",
        triggers=("AIza",),
        token=True,
    ),
    Detector(
        "aws_access_key_id",
        "AWS_ACCESS_KEY",
        compile_pattern(
            r"(?<![A-Za-z0-9])(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA)"
            r"(?P<body>[A-Z0-9]{16})(?![A-Za-z0-9])"
        ),
        validator="token_body",
        triggers=AWS_KEY_ID_PREFIXES,
        token=True,
    ),
    Detector(
        "aws_secret_access_key",
        "AWS_ACCESS_KEY",
        compile_pattern(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])"),
        validator="aws_secret",
        min_length=40,
        anchor="token_runs_40",
    ),
    *VENDOR_DETECTORS,
    Detector(
        "secret_assignment",
        "SECRET_ASSIGNMENT",
        _ASSIGNMENT,
        validator="secret_assignment",
        context=SECRET_KEYWORDS,
        min_length=5,
        anchor="keyword_identifiers",
        anchored=True,
    ),
    Detector(
        "secret_comparison",
        "SECRET_ASSIGNMENT",
        _KEY_ONLY,
        validator="secret_comparison",
        triggers=("==", "!="),
        context=SECRET_KEYWORDS,
        min_length=8,
        anchor="all_keyword_identifiers",
        anchored=True,
    ),
    Detector(
        "url_credentials",
        "SECRET_ASSIGNMENT",
        compile_pattern(
            r"(?<=[A-Za-z0-9])://[^\s:@/\"'<>]{0,128}:(?P<pw>[^\s:@/\"'<>]{1,128})@(?=[A-Za-z0-9\[])"
        ),
        group="pw",
        validator="url_credentials",
        triggers=("://",),
    ),
    Detector(
        "curl_credentials",
        "SECRET_ASSIGNMENT",
        # The command's name; the validator reads its `-u` / `--user` options.
        compile_pattern(r"(?<![A-Za-z0-9_\-.])curl(?![A-Za-z0-9_\-])"),
        validator="curl_credentials",
        triggers=("curl",),
        min_length=8,
    ),
    Detector(
        "email",
        "EMAIL",
        compile_pattern(
            r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]{0,63}[A-Za-z0-9_%+\-]@"
            r"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
            r"(?:\.|[ ]?[\[({][ ]?(?i:dot)[ ]?[\])}][ ]?))+"
            # A dash may follow the top-level label (`…@example.net-she`, an em dash read as a
            # dash): no top-level label holds one, so it ends the address.
            r"(?:xn--[A-Za-z0-9\-]{1,59}|[A-Za-z]{2,63})(?![A-Za-z0-9])"
        ),
        validator="email",
        triggers=("@",),
        anchor="at_starts",
        anchored=True,
    ),
    Detector(
        "iban",
        "IBAN",
        # Starts at the check digits: a digit class scans fast; the validator adds the country.
        compile_pattern(r"(?<=(?<![A-Za-z0-9])[A-Za-z]{2})[0-9]{2}(?: ?[A-Za-z0-9]){11,32}+"),
        validator="iban",
        requires=(Requirement(DIGITS, 2),),
        min_length=15,
    ),
    Detector(
        "credit_card",
        "CREDIT_CARD",
        # The run may end in a group that touches a letter (`… 1881 7a`): the validator takes the
        # card before it, and never a window whose last group touches one.
        compile_pattern(r"(?<![A-Za-z0-9_])[0-9](?:[ \-.]?[0-9]){12,}+"),
        validator="card",
        requires=(Requirement(DIGITS, 13),),
        min_length=13,
    ),
    Detector(
        "ssn",
        "SSN",
        # After a letter and a separator (`SSN-078-05-1120`, `ssn_…`) it is one; after a digit and
        # one, a longer number.
        compile_pattern(
            r"(?<![A-Za-z0-9])(?<![0-9][_.\-])[0-9]{3}([\- .])[0-9]{2}\1[0-9]{4}(?![A-Za-z0-9_]|[\-.][0-9])"
        ),
        validator="ssn",
        requires=(Requirement(DIGITS, 9),),
        min_length=11,
    ),
    Detector(
        "ssn_plain",
        "SSN",
        compile_pattern(
            r"(?<![A-Za-z0-9])(?<![0-9][_.\-])[0-9]{3}(?:[0-9]{6}|-[0-9]{6}|[0-9]{2}-[0-9]{4})"
            r"(?![A-Za-z0-9_]|[\-.][0-9])"
        ),
        validator="ssn_plain",
        requires=(Requirement(DIGITS, 9),),
        context=(b"ss", b"soc", b"tax", b"tin"),
        min_length=9,
    ),
    Detector(
        "ipv4",
        "IP",
        compile_pattern(
            r"(?<![A-Za-z0-9_.])(?P<addr>(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
            r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))"
            r"(?:/(?:3[0-2]|[12]?[0-9]))?(?![0-9]|\.[0-9]|[A-Za-z_])"
        ),
        validator="ipv4",
        requires=(Requirement(DIGITS, 4), Requirement(".", 3)),
        min_length=7,
    ),
    Detector(
        "ipv6",
        "IP",
        compile_pattern(
            r"(?<![A-Za-z0-9_:.])(?P<addr>(?:[0-9A-Fa-f]{1,4}|:):[0-9A-Fa-f:]{0,38}"
            r"(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3})?(?:%[A-Za-z0-9_.\-]{1,32})?)"
            r"(?P<cidr>/[0-9]{1,3})?(?![A-Za-z0-9_:]|\.[0-9])"
        ),
        validator="ipv6",
        requires=(Requirement(":", 2),),
    ),
    Detector(
        "phone",
        "PHONE",
        # A run of digits and phone punctuation that starts a token; the validator reads the
        # numbers in it. (A first character class, not a lookbehind, lets the engine skip
        # ahead to the next digit: ten times faster on prose.)
        compile_pattern(r"[+(0-9](?<![A-Za-z0-9_+.\-/].)[0-9 ().\-/+\u00a0]{6,}+"),
        validator="phone",
        requires=(Requirement(DIGITS, 7),),
        min_length=7,
    ),
    Detector(
        "high_entropy",
        "HIGH_ENTROPY",
        compile_pattern(r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/=_\-]{20,}+"),
        validator="high_entropy",
        min_length=HIGH_ENTROPY_MIN_LENGTH,
        anchor="token_runs_20",
    ),
)
