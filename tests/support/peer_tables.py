"""The peer corpus's mapping onto the catalog, and the rows the catalog deliberately disagrees with.

Data for `tests.support.conformance` (which reads the corpus and reports): each peer's entity
type, rule id or plugin name mapped to the catalog's kinds (a type not mapped is out of scope for
the per-kind figures), and `DISAGREEMENTS`, each with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ext_proc.detect.findings import SETS

if TYPE_CHECKING:
    from tests.support.conformance import Case

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
    **{
        f"SECRET:{plugin}": ("API_TOKEN",)
        for plugin in (
            "gitlab_token",
            "mailchimp_key",
            "pypi_token",
            "sendgrid",
            "square_oauth",
            "telegram_token",
        )
    },
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
    "curl-auth-user": ("SECRET_ASSIGNMENT",),  # -u user:password
    # Vendor tokens the catalog reads by their format (ext_proc/detect/catalog/vendors.py).
    **{
        rule: ("API_TOKEN",)
        for rule in (
            "1password-secret-key",
            "1password-service-account-token",
            "age-secret-key",
            "aws-amazon-bedrock-api-key-long-lived",
            "aws-amazon-bedrock-api-key-short-lived",
            "azure-ad-client-secret",
            "clickhouse-cloud-api-secret-key",
            "cloudflare-origin-ca-key",
            "databricks-api-token",
            "facebook-page-access-token",
            "flyio-access-token",
            "gitlab-pat",
            "gitlab-pat-routable",
            "gitlab-ptt",
            "gitlab-rrt",
            "gitlab-runner-authentication-token-routable",
            "grafana-cloud-api-token",
            "grafana-service-account-token",
            "hashicorp-tf-api-token",
            "heroku-api-key-v2",
            "huggingface-access-token",
            "huggingface-organization-api-token",
            "infracost-api-token",
            "intra42-client-secret",
            "mailchimp-api-key",
            "maxmind-license-key",
            "notion-api-token",
            "octopus-deploy-api-key",
            "openshift-user-token",
            "scalingo-api-token",
            "sentry-org-token",
            "square-access-token",
            "square-secret",
            "vault-batch-token",
        )
    },
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
    "vendor rules whose values are read by their key rather than their format (snyk, sonar, "
    "sumologic, softlayer, ibm, cloudant, npm's _authToken, …) and discord": (
        "SECRET_ASSIGNMENT, HIGH_ENTROPY or API_TOKEN find them: measured by the vendor summary"
    ),
    "llm-guard Regex scanner rows": "user-defined patterns, not the catalog",
    "Cordon vault/reidentify rows and redact/proxy rows with should_match false": (
        "test placeholders, restore and policy switches (redactSystem, mode), not detection"
    ),
}

# --- rows we deliberately disagree with ---------------------------------------------------------
# (source, peer type, start of the text) → reason. Every entry must still disagree (the test
# checks), so the list cannot go stale silently.

_FAIL_CLOSED_VALUE = (
    "example-looking values (somefakekey) are redacted: the catalog cannot tell an invented "
    "value from a real one"
)
_DOCUMENTED_EXAMPLE = (
    "AWS's documentation example keys (AKIAIOSFODNN7EXAMPLE and its secret key) are published, never "
    "valid, and common in answers about AWS: a stop-list leaves them alone"
)
_PLACEHOLDER = (
    "a body of x's or of one repeated character after a vendor's prefix is a documentation "
    "placeholder, not a key"
)
_VENDOR_LENGTH = (
    "GitLab's token lengths vary with the token type and version (routable tokens are longer): a "
    "value with a GitLab prefix and 20 or more token characters is redacted (fail closed)"
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
    *(
        Disagreement("detect_secrets", "SECRET:artifactory", True, prefix, _PLACEHOLDER)
        for prefix in (
            "AP6x",
            "AP2x",
            "AP3x",
            "AP5x",
            "APAx",
            "APBx",
            "AKCx",
            " AP6x",
            " AKCx",
            "=AP6x",
            "=AKCx",
            '"AP6x',
            '"AKCx',
            "artif-key:AP6x",
            "artif-key:AKCx",
            "X-JFrog-Art-Api: AKCx",
            "X-JFrog-Art-Api: AP6x",
        )
    ),
    *(Disagreement("detect_secrets", "SECRET:twilio", True, f"{p}xxxx", _PLACEHOLDER) for p in ("SK", "AC")),
    Disagreement(
        "detect_secrets", "SECRET:npm", True, "//registry.npmjs.org/:_authToken=npm_xxxx", _PLACEHOLDER
    ),
    Disagreement(
        "detect_secrets", "AWS_ACCESS_KEY", True, 'aws_access_key = "wJalrXUtnFEMI/', _DOCUMENTED_EXAMPLE
    ),
    *(
        Disagreement("detect_secrets", "SECRET:gitlab_token", False, prefix, _VENDOR_LENGTH)
        for prefix in (
            "glsoat-PREfix_helloworld380_testin_pretty_long_token_long_",
            "GR1348941PREfix_helloworld380_testin_pretty_long_token_long_",
            "glimt-my-tokens_are-correctAB",
            "glptt-Need5_T00-be-exactly-40-chars--ELse_failing",
            "glptt-hellOworld380_testin",
            "glagent-hellOworld380_testin",
            "gloas-checking_Length-Is-",
        )
    ),
    Disagreement(
        "detect_secrets",
        "SECRET:telegram_token",
        False,
        "bot110201543:AA",
        "a bot token right after `bot` is how Telegram's API URLs carry it (/bot<token>/…): redacted",
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
    Disagreement(
        "gitleaks",
        "mailchimp-api-key",
        False,
        "MailchimpSDK.initialize(token: ",
        "32 hex digits and a Mailchimp datacenter (-us18) are a Mailchimp key wherever they stand",
    ),
    *(
        Disagreement("gitleaks", "age-secret-key", True, prefix, _PLACEHOLDER)
        for prefix in (
            'ageToken = "AGE',
            '{\n    "age_token": "AGE',
            "age_token: AGE",
            'ageToken := "AGE',
            'age_TOKEN := "AGE',
        )
    ),
    Disagreement(
        "gitleaks",
        "gcp-service-account",
        True,
        '"type": "service_account"',
        "the `type` field of a key file is no credential; the file's private key is (PRIVATE_KEY)",
    ),
    Disagreement(
        "gitleaks",
        "messagebird-client-id",
        True,
        "const MessageBirdClientID = ",
        "a UUID under an id-named key (ClientID) is an identifier, not a credential",
    ),
    Disagreement(
        "gitleaks",
        "perplexity-api-key",
        True,
        "perplexity_token: pplx-",
        "the expected value ends in the stray quote that closes the line; the key itself is redacted",
    ),
    # Cordon
    Disagreement("cordon", "AWS_ACCESS_KEY", True, "AKIAIOSFODNN7EXAMPLE", _DOCUMENTED_EXAMPLE),
    *(
        Disagreement("cordon", f"fuzz/seeds/{path}/secrets:AWS_ACCESS_KEY", True, "", _DOCUMENTED_EXAMPLE)
        for path in ("detect_spans", "redact_leak", "reidentify_stream")
    ),
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
    Disagreement(
        "llm_guard", "SECRET", True, "I need to pass a key\naws_secret_access_key=", _DOCUMENTED_EXAMPLE
    ),
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
