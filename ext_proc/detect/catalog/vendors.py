"""The vendor tokens of the catalog, as data: one frozen `Detector` per token family.

Where it sits: `detectors.DETECTORS` appends `VENDOR_DETECTORS`, so the engine runs them like any
other detector; their validators are in `validators.py`. Each family is written from the vendor's
token format: a distinctive prefix, the body's alphabet and length, and where the vendor has one,
a structure a validator checks (a CRC32 in base62, base64 that decodes to the vendor's marker, a
bot id). All report `API_TOKEN` except the Bundler credentials, which are a `SECRET_ASSIGNMENT`.

Fast path: every detector here but the anchored ones is a `token` detector (its match is one run
of token characters, at least 16 long, and no letter or digit comes before its prefix), so its
triggers are looked up only among the words of such runs: prose, which has few, costs nothing.
One literal prefix per pattern (or prefixes that share their first letters) keeps the pattern's
own scan at the speed of a substring search where the trigger is present.
"""

from __future__ import annotations

from ext_proc.detect.catalog.anchors import TOKEN_RUN_MIN
from ext_proc.detect.catalog.model import Detector
from ext_proc.detect.catalog.regexes import compile_pattern

API_TOKEN = "API_TOKEN"

# No letter, digit, `_` or `-` before a prefix, none after a body (a token of the same alphabet
# that goes on is another token, or longer than the format allows).
_B = r"(?<![A-Za-z0-9_\-])"
_E = r"(?![A-Za-z0-9_\-])"
# For a prefix that random base64 spells now and then (`EAA` in the zeros of binary data): not
# after `+` or `/` either, so a pasted blob's middle is no token.
_B64 = r"(?<![A-Za-z0-9_\-+/])"


def _token(
    name: str,
    pattern: str,
    triggers: tuple[str, ...],
    validator: str = "vendor_token",
    *,
    kind: str = API_TOKEN,
) -> Detector:
    return Detector(
        name,
        kind,
        compile_pattern(pattern),
        validator=validator,
        triggers=triggers,
        min_length=TOKEN_RUN_MIN,
        token=True,
    )


def _anchored(
    name: str, pattern: str, anchor: str, validator: str, min_length: int, triggers: tuple[str, ...] = ()
) -> Detector:
    """A shape without a prefix, scanned only in its anchor's windows (and, with `triggers`, only
    in texts whose token runs hold one of them)."""
    return Detector(
        name,
        API_TOKEN,
        compile_pattern(pattern),
        validator=validator,
        triggers=triggers,
        min_length=min_length,
        anchor=anchor,
        token=bool(triggers),
    )


_GITLAB_PREFIXES = ("pat", "dt", "ptt", "rt", "rtr", "ft", "imt", "agent", "oas", "soat", "cbt", "ffct")

VENDOR_DETECTORS: tuple[Detector, ...] = (
    # GitLab: personal, deploy, trigger, runner, feed, incoming mail, agent, OAuth application,
    # SCIM, CI job and feature-flag tokens (20 characters, or a routable token with its
    # `.01.xxxxxxxxx` suffix), and runner registration tokens.
    _token(
        "gitlab_token",
        _B + r"gl(?:" + "|".join(_GITLAB_PREFIXES) + r")-(?P<body>[A-Za-z0-9_\-]{20,300}+)"
        r"(?:\.[0-9a-z]{2}\.[0-9a-z]{7,12})?" + _E,
        tuple(f"gl{p}-" for p in _GITLAB_PREFIXES),
    ),
    _token(
        "gitlab_runner_registration",
        _B + r"GR1348941(?P<body>[A-Za-z0-9_\-]{20,64}+)" + _E,
        ("GR1348941",),
    ),
    # Hugging Face: user tokens and legacy organization tokens, 34 letters.
    _token("huggingface_token", _B + r"hf_(?P<body>[A-Za-z]{34})" + _E, ("hf_",), "vendor_random"),
    _token(
        "huggingface_org_token", _B + r"api_org_(?P<body>[A-Za-z]{34})" + _E, ("api_org_",), "vendor_random"
    ),
    # npm: 30 random base62 characters and their CRC32 in 6 base62 digits.
    _token("npm_token", _B + r"npm_(?P<body>[A-Za-z0-9]{36})" + _E, ("npm_",), "checksum_token"),
    # LLM and AI providers beside OpenAI, Anthropic and Google.
    _token("perplexity_key", _B + r"pplx-(?P<body>[A-Za-z0-9]{48})" + _E, ("pplx-",)),
    _token("groq_key", _B + r"gsk_(?P<body>[A-Za-z0-9]{52})" + _E, ("gsk_",)),
    _token("xai_key", _B + r"xai-(?P<body>[A-Za-z0-9]{80})" + _E, ("xai-",)),
    _token("replicate_token", _B + r"r8_(?P<body>[A-Za-z0-9]{37})" + _E, ("r8_",)),
    _token("nvidia_key", _B + r"nvapi-(?P<body>[A-Za-z0-9_\-]{64})" + _E, ("nvapi-",)),
    # Sourcegraph: 40 hex digits, after a 16-digit instance marker or `local_`.
    _token(
        "sourcegraph_token",
        _B + r"sgp_(?:local_|[0-9a-fA-F]{16}_)?(?P<body>[0-9a-fA-F]{40})" + _E,
        ("sgp_",),
        "vendor_hex",
    ),
    # Notion integration tokens.
    _token("notion_token", _B + r"ntn_(?P<body>[A-Za-z0-9]{46})" + _E, ("ntn_",)),
    # Grafana: Cloud API tokens (base64) and service account tokens (with an 8-digit hex check).
    _token(
        "grafana_cloud_token",
        _B + r"glc_(?P<body>[A-Za-z0-9+/]{32,400}+={0,2})(?![A-Za-z0-9+/=_\-])",
        ("glc_",),
        "vendor_random",
    ),
    _token(
        "grafana_service_account_token",
        _B + r"glsa_(?P<body>[A-Za-z0-9]{32})_[0-9a-fA-F]{8}" + _E,
        ("glsa_",),
    ),
    # HashiCorp Vault service, batch and recovery tokens (90 characters and more); Terraform
    # Cloud API tokens.
    _token(
        "vault_token",
        _B + r"hv[sbr]\.(?P<body>[A-Za-z0-9_\-]{90,400}+)" + _E,
        ("hvs.", "hvb.", "hvr."),
        "vendor_random",
    ),
    _token(
        "terraform_token",
        _B + r"[A-Za-z0-9]{14}\.atlasv1\.(?P<body>[A-Za-z0-9_\-]{60,70})" + _E,
        (".atlasv1.",),
    ),
    # Databricks personal access tokens: 32 hex digits.
    _token("databricks_token", _B + r"dapi(?P<body>[0-9a-f]{32})(?:-[0-9])?" + _E, ("dapi",), "vendor_hex"),
    # Fly.io: access tokens, and macaroon tokens (base64, after `FlyV1 ` in a header).
    _token("flyio_token", _B + r"fo1_(?P<body>[A-Za-z0-9_\-]{43})" + _E, ("fo1_",)),
    _token(
        "flyio_macaroon",
        _B + r"fm[12][ar]?_(?P<body>[A-Za-z0-9+/_\-]{100,2000}+={0,2})(?![A-Za-z0-9+/=_\-])",
        ("fm1a_", "fm1r_", "fm2_"),
        "vendor_structured",
    ),
    # AWS Bedrock API keys: long-term keys are base64 of `BedrockAPIKey-…`, short-term ones base64
    # of a presigned `bedrock.amazonaws.com/…` URL.
    _token(
        "bedrock_long_term_key",
        _B + r"ABSK(?P<body>[A-Za-z0-9+/]{100,160}+={0,2})(?![A-Za-z0-9+/=_\-])",
        ("ABSK",),
        "bedrock_key",
    ),
    _token(
        "bedrock_short_term_key",
        _B + r"bedrock-api-key-(?P<body>[A-Za-z0-9+/]{24,4000}+={0,2})(?![A-Za-z0-9+/=_\-])",
        ("bedrock-api-key-",),
        "bedrock_key",
    ),
    # Square: OAuth access tokens and application secrets, and the access tokens that start with
    # EAAA; Facebook's access tokens start with EAA too.
    _token(
        "square_token",
        _B + r"sq0(?:atp|csp)-(?P<body>[A-Za-z0-9_\-]{22,43}+)" + _E,
        ("sq0atp-", "sq0csp-"),
        "vendor_structured",
    ),
    _token(
        "eaa_access_token", _B64 + r"EAA(?P<body>[A-Za-z0-9_\-]{60,400}+)" + _E, ("EAA",), "vendor_random"
    ),
    # SendGrid: a 22-character key id and a 43-character secret.
    _token(
        "sendgrid_key",
        _B + r"SG\.[A-Za-z0-9_\-]{22}\.(?P<body>[A-Za-z0-9_\-]{43})" + _E,
        ("SG.",),
    ),
    # PyPI: macaroons, base64 of a serialized macaroon (version byte, then the location).
    _token(
        "pypi_token",
        _B + r"pypi-AgE(?P<body>[A-Za-z0-9_\-]{120,2000}+)" + _E,
        ("pypi-AgE",),
        "vendor_structured",
    ),
    # Sentry: organization tokens (base64 JSON, then a secret) and user tokens (64 hex digits).
    _token(
        "sentry_token",
        _B
        + r"sntry(?:s_(?P<body>eyJ[A-Za-z0-9+/=]{20,600}+_[A-Za-z0-9+/]{43}={0,2})|u_(?P<hex>[0-9a-f]{64}))"
        r"(?![A-Za-z0-9+/=_\-])",
        ("sntrys_", "sntryu_"),
        "vendor_structured",
    ),
    # Infracost, Octopus Deploy, OpenShift, Scalingo, 42 (intra), Heroku (v2), DigitalOcean,
    # Shopify, Linear, Postman, Doppler, Brevo.
    _token(
        "infracost_token",
        r"(?<![A-Za-z0-9_\-.])ico-(?P<body>[A-Za-z0-9]{32})" + _E,
        ("ico-",),
        "vendor_random",
    ),
    _token("octopus_key", r"(?<![A-Za-z0-9_\-.])API-(?P<body>[A-Z0-9]{26})" + _E, ("API-",), "vendor_random"),
    _token(
        "openshift_token", _B + r"sha256~(?P<body>[A-Za-z0-9_\-]{43})" + _E, ("sha256~",), "vendor_random"
    ),
    _token("scalingo_token", _B + r"tk-us-(?P<body>[A-Za-z0-9_\-]{48})" + _E, ("tk-us-",)),
    _token("intra42_secret", _B + r"s-s4t2(?:ud|af)-(?P<body>[0-9a-f]{64})" + _E, ("s-s4t2",), "vendor_hex"),
    _token("heroku_key", _B + r"HRKU-AA(?P<body>[A-Za-z0-9_\-]{58})" + _E, ("HRKU-",)),
    _token(
        "digitalocean_token",
        _B + r"do[opr]_v1_(?P<body>[0-9a-f]{64})" + _E,
        ("doo_", "dop_", "dor_"),
        "vendor_hex",
    ),
    _token(
        "shopify_token",
        _B + r"shp(?:at|ca|pa|ss)_(?P<body>[0-9a-fA-F]{32})" + _E,
        ("shpat_", "shpca_", "shppa_", "shpss_"),
        "vendor_hex",
    ),
    _token("linear_key", _B + r"lin_api_(?P<body>[A-Za-z0-9]{40})" + _E, ("lin_api_",)),
    _token("postman_key", _B + r"PMAK-[0-9a-f]{24}-(?P<body>[0-9a-f]{34})" + _E, ("PMAK-",), "vendor_hex"),
    _token("doppler_token", _B + r"dp\.(?:pt|st|ct|scim|audit)\.(?P<body>[A-Za-z0-9]{40,44})" + _E, ("dp.",)),
    _token(
        "brevo_key", _B + r"xkeysib-(?P<body>[0-9a-f]{64})-[A-Za-z0-9]{16}" + _E, ("xkeysib-",), "vendor_hex"
    ),
    # Atlassian API tokens (their 8 hex digits after `=` are a check).
    _token(
        "atlassian_token", _B + r"AT[AC]TT3(?P<body>[A-Za-z0-9_\-=]{100,400}+)" + _E, ("ATATT3", "ATCTT3")
    ),
    # ClickHouse Cloud key secrets.
    _token("clickhouse_secret", _B64 + r"4b1d(?P<body>[A-Za-z0-9]{38})" + _E, ("4b1d",), "vendor_random"),
    # Cloudflare Origin CA keys.
    _token(
        "cloudflare_origin_ca_key",
        _B + r"v1\.0-[0-9a-f]{24}-(?P<body>[0-9a-f]{146})" + _E,
        ("v1.0-",),
        "vendor_hex",
    ),
    # MaxMind license keys.
    _token(
        "maxmind_license_key",
        _B + r"(?P<body>[A-Za-z0-9]{6}_[A-Za-z0-9]{29})_mmk" + _E,
        ("_mmk",),
    ),
    # 1Password: service account tokens (base64 JSON) and account secret keys.
    _token(
        "onepassword_service_token",
        _B + r"ops_(?P<body>eyJ[A-Za-z0-9+/=_\-]{100,4000}+)" + _E,
        ("ops_",),
        "vendor_structured",
    ),
    _token(
        "onepassword_secret_key",
        _B + r"A3-(?P<body>[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}"
        r"-[A-Z0-9]{5})" + _E,
        ("A3-",),
    ),
    # age secret keys (Bech32).
    _token(
        "age_secret_key",
        _B + r"AGE-SECRET-KEY-1(?P<body>[02-9AC-HJ-NP-Z]{58})" + _E,
        ("AGE-SECRET-KEY-1",),
        "vendor_structured",
    ),
    # Bundler's credentials for a gem source (`BUNDLE_GEMS__EXAMPLE__COM=user:password`, Sidekiq
    # Enterprise's among them): the value after the key.
    _token(
        "bundler_credentials",
        r"(?<![A-Za-z0-9_])(?=[A-Z0-9_\-]{16})BUNDLE_(?:[A-Z0-9]++(?:-[A-Z0-9]++)*+__)++[A-Z]{2,24}+(?![A-Za-z0-9_])",
        ("BUNDLE_",),
        "bundler_credentials",
        kind="SECRET_ASSIGNMENT",
    ),
    # Shapes without a prefix, found where their one literal is: Mailchimp keys (32 hex digits
    # and a datacenter), Azure AD client secrets (`Q~` after four characters), Telegram bot tokens
    # (a bot id, `:AA` and 33 characters), Discord bot tokens (base64 of the bot id, a time stamp
    # and an HMAC).
    _anchored(
        "mailchimp_key",
        r"(?<![A-Za-z0-9])(?P<body>[0-9a-f]{32})-us[0-9]{1,2}(?![A-Za-z0-9])",
        "mailchimp_datacenter",
        "vendor_hex",
        36,
        ("-us",),
    ),
    _anchored(
        "azure_client_secret",
        r"(?<![A-Za-z0-9_~.\-])[A-Za-z0-9_~.\-]{3}[0-9]Q~(?P<body>[A-Za-z0-9_~.\-]{31,34})(?![A-Za-z0-9_~.\-])",
        "azure_secret_marker",
        "vendor_token",
        37,
        ("~",),
    ),
    _anchored(
        "telegram_bot_token",
        r"(?<![A-Za-z0-9_\-:])(?:bot)?(?P<id>[0-9]{8,10}):(?P<body>AA[A-Za-z0-9_\-]{33})" + _E,
        "telegram_token_marker",
        "telegram_token",
        44,
        (":AA",),
    ),
    _anchored(
        "discord_bot_token",
        _B + r"(?P<id>[MNO][A-Za-z0-9_\-]{22,26})\.[A-Za-z0-9_\-]{6}\.(?P<body>[A-Za-z0-9_\-]{27,38})" + _E,
        "dotted_token_runs",
        "discord_token",
        58,
    ),
)
