"""Policy files (SPEC §10): a valid directory loads; every invalid one names file, key and reason."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ext_proc.__main__ import main
from ext_proc.detect.findings import ALL_SETS
from ext_proc.policy import load as policy_load
from ext_proc.policy.load import (
    NOT_YET_SUPPORTED,
    deployment_check,
    load_policy_dir,
    load_policy_file,
    policy_signature,
    reload_policy_dir,
)
from ext_proc.policy.model import (
    DEFAULT_VAULT_TTL_SECONDS,
    MODE_STRICTNESS,
    Policy,
    PolicyError,
    PolicySet,
    hash_api_key,
)
from ext_proc.policy.snapshot import dump_policy_set, load_policy_snapshot
from ext_proc.policy.strictness import less_strict_knobs
from tests.unit.test_policy_extensions import EXTENSION_STRICTER, LOOSEST_EXTENSIONS, STRICTEST_EXTENSIONS

ROOT = Path(__file__).resolve().parents[2]
ACME_KEY = "sk-acme-0123456789abcdef"  # invented; files store only its digest
ACME_DIGEST = hash_api_key(ACME_KEY)
# Every knob of a policy file → its `Policy` attribute (all but tenant and apiKeys).
KNOB_ATTRS = {
    "mode": "mode",
    "sets": "sets",
    "failMode": "fail_mode",
    "redactSystem": "redact_system",
    "consistentPseudonyms": "consistent_pseudonyms",
    "vaultTtlSeconds": "vault_ttl_seconds",
    "requireSubject": "require_subject",
    "subjectMedia": "subject_media",
    "media": "media",
    "reportOnly": "report_only",
    "allowHeaderOverride": "allow_header_override",
    "skipDocumentationIps": "skip_documentation_ips",
    "outputGate": "output_gate",
    "outputSets": "output_sets_given",
    "upstreams": "upstreams",
    # The catalog's extensions: four keys, one value (tests/unit/test_policy_extensions.py).
    "customKinds": "extensions",
    "allow": "extensions",
    "deny": "extensions",
    "actions": "extensions",
}
DEFAULT_YAML = "tenant: default\nmode: reversible\nsets: [pii, pci, secrets]\nfailMode: closed\n"


def write_dir(root: Path, files: dict[str, str]) -> Path:
    """A policy directory holding `files` (name → text)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def acme(extra: str = "") -> str:
    return f'tenant: acme\napiKeys: ["sha256:{ACME_DIGEST}"]\n{extra}'


def load_error(root: Path, files: dict[str, str]) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load_policy_dir(write_dir(root, files))
    return info.value


def assert_names(err: PolicyError, path: Path, key: str, reason: str) -> None:
    """The error names the file, the key and (a fragment of) the reason, also in its message."""
    assert err.source == str(path)
    assert err.key == key
    assert reason in err.reason
    assert str(err) == f"{path}: {key}: {err.reason}"


# --- a valid directory --------------------------------------------------------------------------


def test_valid_directory_loads_default_and_keyed_tenant(tmp_path: Path) -> None:
    """Both tenants load with their knobs; unset knobs keep the strict defaults."""
    root = write_dir(
        tmp_path,
        {
            "default.yaml": DEFAULT_YAML,
            "acme.yaml": acme("mode: strip\nsets: [secrets, pii]\nfailMode: open\nupstreams: [openai]\n"),
        },
    )
    policies = load_policy_dir(root)
    assert set(policies.tenants) == {"default", "acme"}
    default, tenant = policies.default, policies.tenants["acme"]
    assert default.tenant == "default"
    assert default.mode == "reversible"
    assert default.sets == ALL_SETS
    assert default.api_keys == frozenset()
    assert default.source == str(root / "default.yaml")
    assert tenant.mode == "strip"
    assert tenant.sets == ("pii", "secrets")  # the catalog's order, not the file's
    assert tenant.fail_mode == "open"
    assert tenant.upstreams == frozenset({"openai"})
    assert tenant.api_keys == frozenset({ACME_DIGEST})
    assert tenant.redact_system is True
    assert tenant.subject_media == "block"
    assert tenant.source == str(root / "acme.yaml")


def test_for_api_key_selects_by_sha256_of_the_raw_key(tmp_path: Path) -> None:
    """The raw key selects its tenant; its digest, an unknown key, "" and None get the default."""
    policies = load_policy_dir(write_dir(tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": acme()}))
    assert policies.for_api_key(ACME_KEY).tenant == "acme"
    assert policies.for_api_key(ACME_DIGEST).tenant == "default"
    assert policies.for_api_key(ACME_KEY + "x").tenant == "default"
    assert policies.for_api_key("").tenant == "default"
    assert policies.for_api_key(None).tenant == "default"


def test_hash_api_key_is_sha256_hex() -> None:
    """The digest is the well-known sha256 of the UTF-8 key."""
    assert hash_api_key("test") == "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


@pytest.mark.parametrize("written", ["off", "report", "deny", '"off"'])
def test_output_gate_values_load(tmp_path: Path, written: str) -> None:
    """outputGate takes off (bare or quoted: YAML 1.1 reads a bare off as false), report, deny."""
    path = write_dir(tmp_path, {"t.yaml": f"tenant: t\noutputGate: {written}\n"}) / "t.yaml"
    assert load_policy_file(path).output_gate == written.strip('"')


@pytest.mark.parametrize("written", ["allow", "mask", "block", '"mask"'])
def test_media_values_load(tmp_path: Path, written: str) -> None:
    """media (requests without declared subjects) takes allow, mask or block; default allow."""
    path = write_dir(tmp_path, {"t.yaml": f"tenant: t\nmedia: {written}\n"}) / "t.yaml"
    assert load_policy_file(path).media == written.strip('"')
    bare = write_dir(tmp_path, {"u.yaml": "tenant: u\nsubjectMedia: mask\n"}) / "u.yaml"
    assert load_policy_file(bare).media == "allow"


def test_media_is_reloaded_and_a_bad_value_keeps_the_last_good_one(tmp_path: Path) -> None:
    root = write_dir(tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": acme("media: mask\n")})
    first = load_policy_dir(root)
    assert first.tenants["acme"].media == "mask"
    write_dir(root, {"acme.yaml": acme("media: block\n")})
    second, errors = reload_policy_dir(root, first)
    assert errors == [] and second.tenants["acme"].media == "block"
    write_dir(root, {"acme.yaml": acme("media: hidden\n")})
    third, errors = reload_policy_dir(root, second)
    assert [(e.key, e.source) for e in errors] == [("media", str(root / "acme.yaml"))]
    assert third.tenants["acme"].media == "block"
    # A worker restarted meanwhile starts from the snapshot the others wrote: media kept.
    assert load_policy_snapshot(dump_policy_set(third)).tenants["acme"].media == "block"


def test_output_sets_default_to_the_tenants_sets(tmp_path: Path) -> None:
    files = {
        "a.yaml": "tenant: a\nsets: [pii]\n",
        "b.yaml": "tenant: b\nsets: [pii]\noutputSets: [secrets]\n",
        "c.yaml": "tenant: c\noutputSets: null\noutputGate: off\n",
    }
    root = write_dir(tmp_path, files)
    a, b, c = (load_policy_file(root / name) for name in files)
    assert a.output_sets == ("pii",) and b.output_sets == ("secrets",)
    assert c.output_sets == ALL_SETS and c.output_gate_sets == ()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("outputGate: block", "outputGate"),
        ("outputSets: [pii, bogus]", "outputSets"),
        ("outputSets: pii", "outputSets"),
    ],
)
def test_bad_output_gate_knobs_are_named(tmp_path: Path, text: str, key: str) -> None:
    path = write_dir(tmp_path, {"t.yaml": f"tenant: t\n{text}\n"}) / "t.yaml"
    with pytest.raises(PolicyError) as info:
        load_policy_file(path)
    assert info.value.key == key


@pytest.mark.parametrize("written", ["off", "Off", "OFF", '"off"'])
def test_mode_off_written_bare_is_off(tmp_path: Path, written: str) -> None:
    """YAML 1.1 reads a bare `off` as false; the policy still means mode off."""
    policy = load_policy_file(write_dir(tmp_path, {"t.yaml": f"tenant: t\nmode: {written}\n"}) / "t.yaml")
    assert policy.mode == "off"


def test_knob_table_covers_every_policy_field() -> None:
    """A knob added to Policy must be added here too (and so to the strictness table's tests)."""
    fields = {f.name for f in dataclasses.fields(Policy)} - {"tenant", "api_keys", "source"}
    assert set(KNOB_ATTRS.values()) == fields


@pytest.mark.parametrize("knob", ["reportOnly", "allowHeaderOverride", "consistentPseudonyms"])
def test_supported_knob_true_loads(tmp_path: Path, knob: str) -> None:
    """reportOnly, allowHeaderOverride and consistentPseudonyms are honoured now: true loads (the
    secret consistent pseudonyms need is the deployment's business, not the file's)."""
    path = write_dir(tmp_path, {"t.yaml": f"tenant: t\n{knob}: true\n"}) / "t.yaml"
    assert getattr(load_policy_file(path), KNOB_ATTRS[knob]) is True


def test_every_knob_is_supported_now() -> None:
    assert NOT_YET_SUPPORTED == {}


def test_not_yet_supported_mechanism(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A knob listed as not yet supported loads as false and is refused as true, naming the knob.
    (The list is empty today; a knob is borrowed to keep the mechanism tested for the next one.)"""
    monkeypatch.setitem(policy_load.NOT_YET_SUPPORTED, "requireSubject", "not built yet")
    off = write_dir(tmp_path, {"f.yaml": "tenant: t\nrequireSubject: false\n"}) / "f.yaml"
    assert load_policy_file(off).require_subject is False
    on = write_dir(tmp_path, {"t.yaml": "tenant: t\nrequireSubject: true\n"}) / "t.yaml"
    with pytest.raises(PolicyError) as info:
        load_policy_file(on)
    assert_names(info.value, on, "requireSubject", "not built yet")


@pytest.mark.parametrize("seconds", [60, 3600, DEFAULT_VAULT_TTL_SECONDS, 2592000])
def test_vault_ttl_loads(tmp_path: Path, seconds: int) -> None:
    path = write_dir(tmp_path, {"t.yaml": f"tenant: t\nvaultTtlSeconds: {seconds}\n"}) / "t.yaml"
    assert load_policy_file(path).vault_ttl_seconds == seconds


def test_vault_ttl_default_is_a_day() -> None:
    assert Policy(tenant="t").vault_ttl_seconds == DEFAULT_VAULT_TTL_SECONDS == 86400


# --- what the deployment must provide (TENANT_SECRET) ---------------------------------------------


def test_consistent_pseudonyms_without_tenant_secret_name_file_and_knob(tmp_path: Path) -> None:
    """The server's load (not `policy check`) refuses consistent pseudonyms without TENANT_SECRET."""
    files = {"default.yaml": DEFAULT_YAML, "acme.yaml": acme("consistentPseudonyms: true\n")}
    root = write_dir(tmp_path, files)
    assert load_policy_dir(root).tenants["acme"].consistent_pseudonyms  # the file itself is valid
    with pytest.raises(PolicyError) as info:
        load_policy_dir(root, check=deployment_check(tenant_secret=False))
    assert_names(info.value, root / "acme.yaml", "consistentPseudonyms", "needs TENANT_SECRET")
    loaded = load_policy_dir(root, check=deployment_check(tenant_secret=True))
    assert loaded.tenants["acme"].consistent_pseudonyms


def test_reload_keeps_the_last_good_version_of_a_file_needing_tenant_secret(tmp_path: Path) -> None:
    """On reload, a file turning consistent pseudonyms on without TENANT_SECRET is rejected like an
    invalid one: its last good version stays; a new such file is left out. Both are reported."""
    check = deployment_check(tenant_secret=False)
    root = write_dir(tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": acme("mode: strip\n")})
    previous = load_policy_dir(root, check=check)
    write_dir(root, {"acme.yaml": acme("consistentPseudonyms: true\n")})
    write_dir(
        root, {"beta.yaml": f'tenant: beta\napiKeys: ["sha256:{BETA_DIGEST}"]\nconsistentPseudonyms: true\n'}
    )
    policies, errors = reload_policy_dir(root, previous, check=check)
    assert policies.tenants["acme"] is previous.tenants["acme"] and policies.tenants["acme"].mode == "strip"
    assert "beta" not in policies.tenants
    assert sorted((Path(e.source).name, e.key) for e in errors) == [
        ("acme.yaml", "consistentPseudonyms"),
        ("beta.yaml", "consistentPseudonyms"),
    ]
    accepted, none = reload_policy_dir(root, previous, check=deployment_check(tenant_secret=True))
    assert none == [] and accepted.tenants["beta"].consistent_pseudonyms


def test_policy_check_passes_consistent_pseudonyms_without_the_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`policy check` is for CI, which holds no secret: the file is valid, so it passes."""
    monkeypatch.delenv("TENANT_SECRET", raising=False)
    files = with_default("acme.yaml", acme("consistentPseudonyms: true\nvaultTtlSeconds: 3600\n"))
    code, out, err = cli_check(tmp_path / "p", files, capsys)
    assert (code, err) == (0, "")
    assert "tenant=acme" in out


# --- one bad file: file, key and reason ----------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "key", "reason"),
    [
        ("mdoe: strip\n", "mdoe", "unknown key"),
        ("Mode: strip\n", "Mode", "unknown key"),
        ("1: strip\n", "1", "unknown key"),
        ("mode: 1\n", "mode", "must be one of reversible, surrogate, strip, off"),
        ("mode: loud\n", "mode", "must be one of"),
        ("mode: true\n", "mode", "must be one of"),
        ("mode: [strip]\n", "mode", "must be one of"),
        ("sets: pii\n", "sets", "must be a list of strings"),
        ("sets: [1]\n", "sets", "must be a list of strings"),
        ("sets: {pii: true}\n", "sets", "must be a list of strings"),
        ("failMode: true\n", "failMode", "must be one of closed, open"),
        ("failMode: ajar\n", "failMode", "must be one of"),
        ('redactSystem: "yes"\n', "redactSystem", "must be true or false"),
        ("redactSystem: 1\n", "redactSystem", "must be true or false"),
        ("redactSystem: null\n", "redactSystem", "must be true or false"),
        ('consistentPseudonyms: "true"\n', "consistentPseudonyms", "must be true or false"),
        ("vaultTtlSeconds: 59\n", "vaultTtlSeconds", "whole number of seconds from 60 to 2592000"),
        ("vaultTtlSeconds: 2592001\n", "vaultTtlSeconds", "from 60 to 2592000"),
        ("vaultTtlSeconds: 3600.5\n", "vaultTtlSeconds", "whole number of seconds"),
        ('vaultTtlSeconds: "3600"\n', "vaultTtlSeconds", "whole number of seconds"),
        ("vaultTtlSeconds: true\n", "vaultTtlSeconds", "whole number of seconds"),
        ("vaultTtlSeconds: -1\n", "vaultTtlSeconds", "whole number of seconds"),
        ("requireSubject: 0\n", "requireSubject", "must be true or false"),
        ("subjectMedia: 3\n", "subjectMedia", "must be one of block, mask, allow"),
        ("subjectMedia: hide\n", "subjectMedia", "must be one of"),
        ("media: hide\n", "media", "must be one of block, mask, allow"),
        ("media: off\n", "media", "must be one of block, mask, allow"),
        ("media: [mask]\n", "media", "must be one of"),
        ("media: Mask\n", "media", "must be one of"),
        ("mode: off\nmedia: mask\n", "media", "cannot be combined with mode: off"),
        ("mode: off\nmedia: block\n", "media", "cannot be combined with mode: off"),
        ('reportOnly: "no"\n', "reportOnly", "must be true or false"),
        ("allowHeaderOverride: []\n", "allowHeaderOverride", "must be true or false"),
        ("upstreams: openai\n", "upstreams", "must be a list of strings"),
        ("upstreams: [1]\n", "upstreams", "must be a list of strings"),
        ("skipDocumentationIps: 1.5\n", "skipDocumentationIps", "must be true or false"),
        ("sets: [pii, phi]\n", "sets", "unknown set 'phi'"),
        ("sets: [pii, pci, pii]\n", "sets", "lists a set twice"),
        ("upstreams: [openai, azure]\n", "upstreams", "unknown upstream 'azure'"),
    ],
)
def test_bad_knob_names_file_key_and_reason(tmp_path: Path, extra: str, key: str, reason: str) -> None:
    """A wrong type, an unknown value or an unknown key fails with file, key and reason."""
    err = load_error(tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": acme(extra)})
    assert_names(err, tmp_path / "acme.yaml", key, reason)


@pytest.mark.parametrize(
    ("tenant_line", "reason"),
    [
        ("", "must be a name"),
        ("tenant: 12\n", "must be a name"),
        ("tenant: ''\n", "must be a name"),
        ("tenant: 'a b'\n", "must be a name"),
        ("tenant: '../etc'\n", "must be a name"),
        (f"tenant: {'a' * 65}\n", "at most 64"),
    ],
)
def test_bad_tenant_name(tmp_path: Path, tenant_line: str, reason: str) -> None:
    """A missing or malformed tenant name is refused under the `tenant` key."""
    path = write_dir(tmp_path, {"t.yaml": tenant_line + "mode: strip\n"}) / "t.yaml"
    with pytest.raises(PolicyError) as info:
        load_policy_file(path)
    assert_names(info.value, path, "tenant", reason)


@pytest.mark.parametrize(
    "entry",
    [
        "sk-live-abcdefghijklmnopqrstuvwxyz0123456789",  # a raw key pasted by mistake
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 65,
        "sha256:" + "A" * 64,
        "SHA256:" + "a" * 64,
        "sha512:" + "a" * 64,
        "sha256:" + "g" * 64,
        "sha256: " + "a" * 64,
        "a" * 64,
    ],
)
def test_bad_api_key_entry_is_refused_without_echo(tmp_path: Path, entry: str) -> None:
    """An apiKeys entry that is not sha256:<64 lowercase hex> is refused, and never echoed."""
    text = f'tenant: acme\napiKeys: ["sha256:{ACME_DIGEST}", "{entry}"]\n'
    err = load_error(tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": text})
    assert_names(err, tmp_path / "acme.yaml", "apiKeys", "64 lowercase hex")
    body = entry.partition(":")[2].strip() or entry
    assert entry not in str(err)
    assert body not in str(err)
    assert body not in repr(err)


def test_missing_default_yaml(tmp_path: Path) -> None:
    """A directory without default.yaml is refused, naming the missing file."""
    err = load_error(tmp_path, {"acme.yaml": acme()})
    assert_names(err, tmp_path / "default.yaml", "(file)", "is missing")


@pytest.mark.parametrize(
    "files",
    [{"main.yaml": "tenant: default\n"}, {"a.yaml": "tenant: default\n", "default.yaml": DEFAULT_YAML}],
)
def test_default_tenant_in_another_file(tmp_path: Path, files: dict[str, str]) -> None:
    """The default tenant may only live in default.yaml."""
    err = load_error(tmp_path, files)
    name = next(n for n in files if n != "default.yaml")
    assert_names(err, tmp_path / name, "tenant", "lives in default.yaml")


def test_default_yaml_holding_another_tenant(tmp_path: Path) -> None:
    """default.yaml must define the tenant `default`, not another one."""
    err = load_error(tmp_path, {"default.yaml": "tenant: acme\n"})
    assert_names(err, tmp_path / "default.yaml", "tenant", "default.yaml")


def test_default_tenant_with_api_keys(tmp_path: Path) -> None:
    """The default tenant is what no key selects: it may not list keys."""
    text = f'tenant: default\napiKeys: ["sha256:{ACME_DIGEST}"]\n'
    err = load_error(tmp_path, {"default.yaml": text})
    assert_names(err, tmp_path / "default.yaml", "apiKeys", "selected by no key")


def test_default_yml_with_api_keys_names_the_real_file(tmp_path: Path) -> None:
    """The error names default.yml when that is the file that lists keys."""
    text = f'tenant: default\napiKeys: ["sha256:{ACME_DIGEST}"]\n'
    err = load_error(tmp_path, {"default.yml": text})
    assert_names(err, tmp_path / "default.yml", "apiKeys", "selected by no key")


def test_tenant_defined_twice(tmp_path: Path) -> None:
    """Two files defining one tenant: the second file (in name order) is named."""
    err = load_error(
        tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": acme(), "acme2.yml": "tenant: acme\n"}
    )
    assert_names(err, tmp_path / "acme2.yml", "tenant", "also defined in another file")


def test_one_key_digest_selecting_two_tenants(tmp_path: Path) -> None:
    """A key digest listed by two tenants would make selection ambiguous."""
    beta = f'tenant: beta\napiKeys: ["sha256:{ACME_DIGEST}"]\n'
    err = load_error(tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": acme(), "beta.yaml": beta})
    assert_names(err, tmp_path / "beta.yaml", "apiKeys", "also selects another tenant")
    assert ACME_DIGEST not in str(err)


def test_invalid_yaml_gives_the_line(tmp_path: Path) -> None:
    """A YAML syntax error names the file and the line, not the text."""
    err = load_error(
        tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": "tenant: acme\nmode: strip\n  sets: x\n"}
    )
    assert_names(err, tmp_path / "acme.yaml", "(file)", "is not valid YAML at line 3")


@pytest.mark.parametrize("text", ["- tenant: acme\n", "just words\n", "", "# only a comment\n", "42\n"])
def test_non_mapping_file(tmp_path: Path, text: str) -> None:
    """A file that is not a mapping (a list, a scalar, empty) is refused as a whole."""
    err = load_error(tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": text})
    assert_names(err, tmp_path / "acme.yaml", "(file)", "must be a YAML mapping")


def test_not_a_directory(tmp_path: Path) -> None:
    """A policy directory that does not exist is refused, naming it."""
    with pytest.raises(PolicyError) as info:
        load_policy_dir(tmp_path / "nowhere")
    assert_names(info.value, tmp_path / "nowhere", "(directory)", "does not exist")


def test_unreadable_entry(tmp_path: Path) -> None:
    """A `*.yaml` that cannot be read (here a directory) is a PolicyError naming it."""
    write_dir(tmp_path, {"default.yaml": DEFAULT_YAML})
    (tmp_path / "odd.yaml").mkdir()
    with pytest.raises(PolicyError) as info:
        load_policy_dir(tmp_path)
    assert_names(info.value, tmp_path / "odd.yaml", "(file)", "cannot be read")


def test_non_utf8_file_is_a_policy_error(tmp_path: Path) -> None:
    """A file in another encoding is reported like any other bad file."""
    write_dir(tmp_path, {"default.yaml": DEFAULT_YAML})
    (tmp_path / "acme.yaml").write_bytes("# caf\u00e9 team\ntenant: acme\n".encode("latin-1"))
    err = load_error(tmp_path, {})
    assert_names(err, tmp_path / "acme.yaml", "(file)", "")


def test_key_written_twice_is_refused(tmp_path: Path) -> None:
    """A knob written twice is ambiguous (YAML requires unique keys) and must not load silently."""
    err = load_error(tmp_path, {"default.yaml": DEFAULT_YAML, "acme.yaml": acme("mode: strip\nmode: off\n")})
    assert err.source == str(tmp_path / "acme.yaml")
    assert err.key in ("mode", "(file)")


# --- strictness: which tenant X-Tenant may select -----------------------------------------------

BASE = Policy(tenant="base")
ALL_KNOBS = list(KNOB_ATTRS)  # the order less_strict_knobs reports in

# (knob, a less strict value, a stricter value)
STRICTER: list[tuple[str, object, object]] = [
    ("mode", "off", "reversible"),
    ("mode", "reversible", "strip"),
    ("mode", "off", "strip"),
    ("sets", ("pii",), ("pii", "secrets")),
    ("sets", ("pii", "pci"), ALL_SETS),
    ("sets", (), ("pci",)),
    ("failMode", "open", "closed"),
    ("redactSystem", False, True),
    ("consistentPseudonyms", True, False),
    ("vaultTtlSeconds", 7200, 3600),  # compared between tenants that keep values (BASES)
    ("requireSubject", False, True),
    ("subjectMedia", "allow", "mask"),
    ("subjectMedia", "mask", "block"),
    ("subjectMedia", "allow", "block"),
    ("media", "allow", "mask"),
    ("media", "mask", "block"),
    ("media", "allow", "block"),
    ("reportOnly", True, False),
    ("allowHeaderOverride", True, False),
    ("skipDocumentationIps", True, False),
    ("outputGate", "off", "report"),
    ("outputGate", "report", "deny"),
    ("outputGate", "off", "deny"),
    ("outputSets", ("pii",), ("pii", "secrets")),
    ("outputSets", (), ("secrets",)),
    *EXTENSION_STRICTER,
]


def with_knobs(policy: Policy = BASE, **knobs: object) -> Policy:
    """`policy` with knobs given by their policy-file key."""
    return dataclasses.replace(policy, **{KNOB_ATTRS[k]: v for k, v in knobs.items()})


# The base a knob's direction is tested on, where BASE would hide it.
BASES = {"vaultTtlSeconds": with_knobs(consistentPseudonyms=True)}


def test_strictness_cases_cover_every_ordered_knob() -> None:
    """Every knob but upstreams (which has no order, only equality) has a direction case."""
    assert {knob for knob, _, _ in STRICTER} == set(KNOB_ATTRS) - {"upstreams"}


@pytest.mark.parametrize(("knob", "looser", "stricter"), STRICTER)
def test_less_strict_knob_is_named_in_one_direction_only(knob: str, looser: object, stricter: object) -> None:
    """A looser target is refused naming the knob; a stricter target is allowed."""
    base = BASES.get(knob, BASE)
    loose, strict = with_knobs(base, **{knob: looser}), with_knobs(base, **{knob: stricter})
    assert less_strict_knobs(loose, strict) == [knob]
    assert less_strict_knobs(strict, loose) == []


def test_vault_ttl_only_counts_for_a_tenant_that_keeps_values() -> None:
    """vaultTtlSeconds is compared as retention: a tenant without consistent pseudonyms keeps
    nothing, whatever TTL it writes; one that keeps values is less strict than one that does not."""
    keeps_an_hour = with_knobs(consistentPseudonyms=True, vaultTtlSeconds=3600)
    keeps_nothing = with_knobs(consistentPseudonyms=False, vaultTtlSeconds=2592000)
    assert less_strict_knobs(keeps_nothing, keeps_an_hour) == []
    assert less_strict_knobs(keeps_an_hour, keeps_nothing) == ["consistentPseudonyms"]
    assert less_strict_knobs(with_knobs(vaultTtlSeconds=60), with_knobs(vaultTtlSeconds=2592000)) == []


@pytest.mark.parametrize(
    ("knob", "one", "other"),
    [
        ("sets", ("pii",), ("secrets",)),  # disjoint: neither covers the other
        ("sets", ("pii", "pci"), ("pci", "secrets")),
        ("upstreams", frozenset({"openai"}), frozenset({"openai", "anthropic"})),  # fewer is no better
        ("upstreams", frozenset({"openai"}), frozenset({"anthropic"})),
        ("upstreams", frozenset(), frozenset({"anthropic"})),
    ],
)
def test_incomparable_values_are_less_strict_both_ways(knob: str, one: object, other: object) -> None:
    """Sets that do not contain each other, and any two different upstream lists, refuse both ways."""
    first, second = with_knobs(**{knob: one}), with_knobs(**{knob: other})
    assert less_strict_knobs(first, second) == [knob]
    assert less_strict_knobs(second, first) == [knob]


def test_identical_knobs_are_allowed_whatever_the_name_keys_and_file() -> None:
    """Only knobs are compared: another tenant name, key list or source file changes nothing."""
    other = dataclasses.replace(BASE, tenant="other", api_keys=frozenset({ACME_DIGEST}), source="x.yaml")
    assert less_strict_knobs(BASE, BASE) == []
    assert less_strict_knobs(other, BASE) == []


def test_several_less_strict_knobs_are_all_named_in_order() -> None:
    """Every knob the target loosens is named, in the fixed order, whatever order they were set in."""
    loosest = with_knobs(
        upstreams=frozenset({"openai"}),
        skipDocumentationIps=True,
        allowHeaderOverride=True,
        reportOnly=True,
        subjectMedia="allow",
        requireSubject=False,
        consistentPseudonyms=True,
        redactSystem=False,
        failMode="open",
        sets=("pii",),
        mode="off",
        outputGate="off",
        outputSets=("pii",),
        allow=LOOSEST_EXTENSIONS,
    )
    strictest = with_knobs(requireSubject=True, mode="strip", media="mask", deny=STRICTEST_EXTENSIONS)
    # All but vaultTtlSeconds, which only compares tenants that both keep values.
    assert less_strict_knobs(loosest, strictest) == [k for k in ALL_KNOBS if k != "vaultTtlSeconds"]
    both_keep = with_knobs(loosest, vaultTtlSeconds=7200)
    assert less_strict_knobs(both_keep, with_knobs(consistentPseudonyms=True, vaultTtlSeconds=60)) == [
        k
        for k in ALL_KNOBS
        if k not in ("consistentPseudonyms", "requireSubject", "media", "customKinds", "deny")
    ]
    assert less_strict_knobs(strictest, loosest) == ["upstreams"]
    some = with_knobs(upstreams=frozenset({"anthropic"}), failMode="open", mode="off")
    assert less_strict_knobs(some, BASE) == ["mode", "failMode", "upstreams"]


def test_mode_strictness_ranks_every_mode() -> None:
    """off < surrogate < reversible < strip, one rank per mode a policy may hold."""
    assert sorted(MODE_STRICTNESS, key=MODE_STRICTNESS.__getitem__) == [
        "off",
        "surrogate",
        "reversible",
        "strip",
    ]


# --- reload: per-file fallback -------------------------------------------------------------------

BETA_KEY = "sk-beta-fedcba9876543210"  # invented
BETA_DIGEST = hash_api_key(BETA_KEY)


def beta(extra: str = "") -> str:
    return f'tenant: beta\napiKeys: ["sha256:{BETA_DIGEST}"]\n{extra}'


@pytest.fixture
def loaded(tmp_path: Path) -> tuple[Path, PolicySet]:
    """A directory of default, acme and beta, and what it loaded to."""
    root = write_dir(tmp_path / "p", {"default.yaml": DEFAULT_YAML, "acme.yaml": acme(), "beta.yaml": beta()})
    return root, load_policy_dir(root)


def assert_error(err: PolicyError, path: Path, key: str, reason: str) -> None:
    assert (err.source, err.key) == (str(path), key)
    assert reason in err.reason


def test_reload_of_an_unchanged_directory_equals_a_load(loaded: tuple[Path, PolicySet]) -> None:
    root, previous = loaded
    policies, errors = reload_policy_dir(root, previous)
    assert errors == []
    assert policies.tenants == previous.tenants
    assert policies.by_key == previous.by_key


def test_reload_applies_a_valid_change(loaded: tuple[Path, PolicySet]) -> None:
    root, previous = loaded
    write_dir(root, {"acme.yaml": acme("mode: strip\n")})
    policies, errors = reload_policy_dir(root, previous)
    assert errors == []
    assert policies.tenants["acme"].mode == "strip"
    assert policies.for_api_key(ACME_KEY).mode == "strip"


def test_reload_keeps_a_file_still_being_written_and_applies_a_settled_one(
    loaded: tuple[Path, PolicySet],
) -> None:
    """A file still changing is not read: acme keeps its previous policy (even though its half
    written now parses, looser), beta's settled edit applies, and a new file still changing is
    left out until it settles."""
    root, previous = loaded
    write_dir(root, {"acme.yaml": acme(""), "beta.yaml": beta("mode: off\n"), "gamma.yaml": "tenant: ga"})
    policies, errors = reload_policy_dir(root, previous, unsettled={"acme.yaml", "gamma.yaml"})
    assert errors == []
    assert policies.tenants["acme"] is previous.tenants["acme"]
    assert policies.tenants["beta"].mode == "off"
    assert "ga" not in policies.tenants and "gamma" not in policies.tenants


def test_settling_names_the_files_that_changed_recently() -> None:
    from ext_proc.policy.reload import SETTLE_SECONDS, Settling

    settling = Settling((("a.yaml", 1, 10), ("b.yaml", 1, 10)))
    assert not settling.observe((("a.yaml", 1, 10), ("b.yaml", 1, 10)), now=100.0)
    assert settling.observe((("a.yaml", 2, 12), ("b.yaml", 1, 10), ("c.yaml", 1, 1)), now=100.0)
    assert settling.unsettled(100.0 + SETTLE_SECONDS / 2) == {"a.yaml", "c.yaml"}
    assert settling.observe((("a.yaml", 3, 14), ("b.yaml", 1, 10), ("c.yaml", 1, 1)), now=100.4)
    assert settling.unsettled(100.0 + SETTLE_SECONDS) == {"a.yaml"}  # c settled, a changed again
    assert settling.unsettled(100.4 + SETTLE_SECONDS) == frozenset()
    assert settling.observe((("b.yaml", 1, 10),), now=200.0)  # a and c deleted: a change
    assert settling.unsettled(200.0) == frozenset()


def test_reload_keeps_an_invalid_file_previous_policy_and_applies_another_valid_edit(
    loaded: tuple[Path, PolicySet],
) -> None:
    """acme's edit is broken: acme stays as it was; beta's valid edit in the same reload applies."""
    root, previous = loaded
    write_dir(root, {"acme.yaml": acme("mode: strip\nfailmode: open\n"), "beta.yaml": beta("mode: off\n")})
    policies, errors = reload_policy_dir(root, previous)
    assert len(errors) == 1
    assert_error(errors[0], root / "acme.yaml", "failmode", "unknown key")
    assert policies.tenants["acme"] is previous.tenants["acme"]
    assert policies.for_api_key(ACME_KEY) is previous.tenants["acme"]
    assert policies.tenants["beta"].mode == "off"
    assert policies.for_api_key(BETA_KEY).mode == "off"


@pytest.mark.parametrize(
    "broken", ["? [a, b]\n: 1\n", "sets: " + "[" * 3000 + "]" * 3000 + "\n", "mode: 2026-13-45\n"]
)
def test_reload_keeps_a_file_yaml_cannot_build_into_a_policy(
    loaded: tuple[Path, PolicySet], broken: str
) -> None:
    """A key that is a list, nesting past the recursion limit, an impossible date: each a policy
    error like any other (the reload used to end with a TypeError and never run again)."""
    root, previous = loaded
    write_dir(root, {"acme.yaml": acme(broken)})
    policies, errors = reload_policy_dir(root, previous)
    assert [(error.source, error.key) for error in errors] == [(str(root / "acme.yaml"), "(file)")]
    assert policies.tenants["acme"] is previous.tenants["acme"]


def test_reload_keeps_the_previous_default_when_default_yaml_breaks(loaded: tuple[Path, PolicySet]) -> None:
    root, previous = loaded
    write_dir(root, {"default.yaml": "tenant: default\nmode: loud\n"})
    policies, errors = reload_policy_dir(root, previous)
    assert_error(errors[0], root / "default.yaml", "mode", "must be one of")
    assert policies.default is previous.default


def test_reload_leaves_out_a_new_invalid_file(loaded: tuple[Path, PolicySet]) -> None:
    root, previous = loaded
    write_dir(root, {"gamma.yml": "tenant: gamma\nsets: [pii, pii]\n"})
    policies, errors = reload_policy_dir(root, previous)
    assert len(errors) == 1
    assert_error(errors[0], root / "gamma.yml", "sets", "lists a set twice")
    assert set(policies.tenants) == {"default", "acme", "beta"}


def test_reload_drops_the_tenant_of_a_deleted_file(loaded: tuple[Path, PolicySet]) -> None:
    """Its key then selects the default tenant."""
    root, previous = loaded
    (root / "acme.yaml").unlink()
    policies, errors = reload_policy_dir(root, previous)
    assert errors == []
    assert set(policies.tenants) == {"default", "beta"}
    assert policies.for_api_key(ACME_KEY) is policies.default


def test_reload_keeps_the_whole_previous_set_on_a_cross_file_conflict(loaded: tuple[Path, PolicySet]) -> None:
    """Two files defining acme: nothing of this reload applies, not even beta's valid edit."""
    root, previous = loaded
    write_dir(root, {"acme2.yaml": "tenant: acme\n", "beta.yaml": beta("mode: off\n"), "bad.yaml": "[\n"})
    policies, errors = reload_policy_dir(root, previous)
    assert policies is previous
    assert_error(errors[0], root / "acme2.yaml", "tenant", "also defined in another file")
    assert_error(errors[1], root / "bad.yaml", "(file)", "is not valid YAML")
    assert len(errors) == 2


def test_reload_keeps_previous_when_a_key_would_select_two_tenants(loaded: tuple[Path, PolicySet]) -> None:
    root, previous = loaded
    write_dir(root, {"beta.yaml": f'tenant: beta\napiKeys: ["sha256:{ACME_DIGEST}"]\n'})
    policies, errors = reload_policy_dir(root, previous)
    assert policies is previous
    assert_error(errors[0], root / "beta.yaml", "apiKeys", "also selects another tenant")


def test_reload_keeps_previous_when_default_yaml_is_deleted(loaded: tuple[Path, PolicySet]) -> None:
    root, previous = loaded
    (root / "default.yaml").unlink()
    policies, errors = reload_policy_dir(root, previous)
    assert policies is previous
    assert [(e.source, e.key) for e in errors] == [(str(root / "default.yaml"), "(file)")]
    assert "is missing" in errors[0].reason


def test_reload_keeps_previous_when_default_gains_keys(loaded: tuple[Path, PolicySet]) -> None:
    root, previous = loaded
    write_dir(root, {"default.yaml": f'tenant: default\napiKeys: ["sha256:{"1" * 64}"]\n'})
    policies, errors = reload_policy_dir(root, previous)
    assert policies is previous
    assert_error(errors[0], root / "default.yaml", "apiKeys", "selected by no key")


def test_reload_keeps_previous_when_the_directory_is_gone(loaded: tuple[Path, PolicySet]) -> None:
    root, previous = loaded
    moved = root.rename(root.with_name("elsewhere"))
    policies, errors = reload_policy_dir(root, previous)
    assert policies is previous
    assert_error(errors[0], root, "(directory)", "does not exist")
    assert policy_signature(moved) != ()


# --- policy_signature ----------------------------------------------------------------------------


def test_policy_signature_changes_on_edit_and_on_a_new_file(loaded: tuple[Path, PolicySet]) -> None:
    root, _ = loaded
    first = policy_signature(root)
    assert [name for name, _, _ in first] == ["acme.yaml", "beta.yaml", "default.yaml"]
    assert policy_signature(root) == first
    write_dir(root, {"notes.txt": "not a policy\n"})
    assert policy_signature(root) == first
    write_dir(root, {"acme.yaml": acme("mode: strip\n")})  # another size
    edited = policy_signature(root)
    assert edited != first
    write_dir(root, {"gamma.yml": "tenant: gamma\n"})
    added = policy_signature(root)
    assert [name for name, _, _ in added] == ["acme.yaml", "beta.yaml", "default.yaml", "gamma.yml"]
    (root / "gamma.yml").unlink()
    assert policy_signature(root) == edited


def test_policy_signature_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert policy_signature(tmp_path / "nowhere") == ()


def test_policy_signature_sees_a_dangling_symlink(tmp_path: Path) -> None:
    """A link to nothing still counts as a file, so its appearance triggers a reload (which reports it)."""
    root = write_dir(tmp_path, {"default.yaml": DEFAULT_YAML})
    before = policy_signature(root)
    (root / "acme.yaml").symlink_to(tmp_path / "missing.yaml")
    assert policy_signature(root) == (("acme.yaml", -1, -1), *before)


# --- the shipped policies/ -----------------------------------------------------------------------


def test_shipped_default_writes_every_knob_at_its_default() -> None:
    """policies/default.yaml is the reference: every knob written out, each at the built-in default."""
    path = ROOT / "policies" / "default.yaml"
    written = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert set(written) == {"tenant", *KNOB_ATTRS}
    assert load_policy_file(path) == Policy(tenant="default", source=str(path))


def test_shipped_examples_are_selected_by_their_demo_keys() -> None:
    """The demo keys named in the examples' comments select them; X-Tenant could pick strict over default."""
    policies = load_policy_dir(ROOT / "policies")
    support = policies.for_api_key("sk-example-support-key")
    strict = policies.for_api_key("sk-example-strict")
    assert (support.tenant, strict.tenant) == ("example-support", "example-strict")
    assert (strict.mode, strict.require_subject, strict.subject_media, strict.fail_mode) == (
        "strip",
        True,
        "block",
        "closed",
    )
    assert less_strict_knobs(strict, policies.default) == []
    assert less_strict_knobs(policies.default, strict) == ["mode", "requireSubject", "media"]
    assert (support.media, strict.media, policies.default.media) == ("mask", "block", "allow")
    assert less_strict_knobs(support, policies.default) == ["upstreams", "allow", "actions"]


# --- `python -m ext_proc policy check DIR` -------------------------------------------------------


def run_check(directory: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ext_proc", "policy", "check", str(directory)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_policy_check_accepts_the_repository_policies() -> None:
    """The shipped policies/ pass: exit 0, one `ok` line per tenant."""
    result = run_check(ROOT / "policies")
    assert result.returncode == 0, result.stderr
    tenants = load_policy_dir(ROOT / "policies").tenants
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(tenants)
    assert all(line.startswith("ok") for line in lines)
    for name in tenants:
        assert sum(f"tenant={name} " in line for line in lines) == 1


def test_policy_check_reports_file_key_reason(tmp_path: Path) -> None:
    """A broken directory: exit 1, `file: key: reason` on stderr, nothing claimed ok."""
    root = write_dir(tmp_path / "p", {"default.yaml": DEFAULT_YAML, "acme.yaml": acme("mdoe: strip\n")})
    result = run_check(root)
    assert result.returncode == 1
    assert f"{root / 'acme.yaml'}: mdoe: unknown key" in result.stderr
    assert "ok" not in result.stdout


def cli_check(
    root: Path, files: dict[str, str | bytes], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """`policy check` run in this process on a directory of `files`: exit code, stdout, stderr."""
    root.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, bytes):
            (root / name).write_bytes(content)
        else:
            (root / name).write_text(content, encoding="utf-8")
    code = main(["policy", "check", str(root)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def with_default(name: str, text: str | bytes) -> dict[str, str | bytes]:
    return {"default.yaml": DEFAULT_YAML, name: text}


RAW_KEY = "sk-pasted-by-mistake-0123456789"  # invented

# (files, the file named, the key named, a fragment of the reason)
CLI_CASES: list[tuple[dict[str, str | bytes], str, str, str]] = [
    (with_default("acme.yaml", acme("failmode: closed\n")), "acme.yaml", "failmode", "unknown key; known:"),
    (
        with_default("acme.yaml", acme("mode: redact\n")),
        "acme.yaml",
        "mode",
        "must be one of reversible, surrogate, strip",
    ),
    (with_default("acme.yaml", acme("sets: [pii, phi]\n")), "acme.yaml", "sets", "unknown set 'phi'"),
    (with_default("acme.yaml", acme("sets: [pci, pci]\n")), "acme.yaml", "sets", "lists a set twice"),
    (
        with_default("acme.yaml", f'tenant: acme\napiKeys: ["{RAW_KEY}"]\n'),
        "acme.yaml",
        "apiKeys",
        "'sha256:' + 64 lowercase hex",
    ),
    (
        with_default("acme.yaml", acme("mode: strip\nmode: off\n")),
        "acme.yaml",
        "mode",
        "written twice (line 4)",
    ),
    (with_default("acme.yaml", "mode: strip\n"), "acme.yaml", "tenant", "must be a name"),
    (with_default("acme.yaml", "tenant: acme corp\n"), "acme.yaml", "tenant", "must be a name"),
    (with_default("acme.yaml", b"tenant: acme\n# caf\xe9\n"), "acme.yaml", "(file)", "is not UTF-8 text"),
    (
        with_default("acme.yaml", "tenant: acme\nmode: strip\n  sets: x\n"),
        "acme.yaml",
        "(file)",
        "YAML at line 3",
    ),
    (with_default("acme.yaml", "- tenant: acme\n"), "acme.yaml", "(file)", "must be a YAML mapping"),
    (with_default("acme.yaml", acme("? [a, b]\n: 1\n")), "acme.yaml", "(file)", "not a plain name (line 3)"),
    (with_default("acme.yaml", acme("? {a: 1}\n: 1\n")), "acme.yaml", "(file)", "not a plain name (line 3)"),
    (with_default("acme.yaml", acme("sets: [{? [x]: 1}]\n")), "acme.yaml", "(file)", "not a plain name"),
    (
        with_default("acme.yaml", acme("sets: " + "[" * 3000 + "]" * 3000 + "\n")),
        "acme.yaml",
        "(file)",
        "nested",
    ),
    (
        with_default("acme.yaml", acme("mode: 2026-13-45\n")),
        "acme.yaml",
        "(file)",
        "cannot read (ValueError)",
    ),
    ({"acme.yaml": acme()}, "default.yaml", "(file)", "is missing"),
    (
        {"default.yaml": f'tenant: default\napiKeys: ["sha256:{ACME_DIGEST}"]\n'},
        "default.yaml",
        "apiKeys",
        "by no key",
    ),
    (
        {"default.yaml": DEFAULT_YAML, "acme.yaml": acme(), "acme2.yaml": "tenant: acme\n"},
        "acme2.yaml",
        "tenant",
        "tenant 'acme' is also defined in another file",
    ),
    (
        {
            "default.yaml": DEFAULT_YAML,
            "acme.yaml": acme(),
            "beta.yaml": f'tenant: beta\napiKeys: ["sha256:{ACME_DIGEST}"]\n',
        },
        "beta.yaml",
        "apiKeys",
        "also selects another tenant",
    ),
    (
        with_default("acme.yaml", acme("upstreams: [openai, mistral]\n")),
        "acme.yaml",
        "upstreams",
        "'mistral'",
    ),
    (
        with_default("acme.yaml", acme("vaultTtlSeconds: 10\n")),
        "acme.yaml",
        "vaultTtlSeconds",
        "from 60 to 2592000",
    ),
    (
        with_default("acme.yaml", acme('requireSubject: "yes"\n')),
        "acme.yaml",
        "requireSubject",
        "must be true or false",
    ),
    (
        with_default("acme.yml", acme("subjectMedia: hide\n")),
        "acme.yml",
        "subjectMedia",
        "block, mask, allow",
    ),
    (
        with_default("acme.yaml", acme("media: hide\n")),
        "acme.yaml",
        "media",
        "block, mask, allow",
    ),
    (
        with_default("default.yml", "tenant: default\n"),
        "default.yml",
        "tenant",
        "also defined in another file",
    ),
]


@pytest.mark.parametrize(
    ("files", "name", "key", "reason"), CLI_CASES, ids=[f"{name}:{key}" for _, name, key, _ in CLI_CASES]
)
def test_policy_check_names_the_exact_file_key_and_reason(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    files: dict[str, str | bytes],
    name: str,
    key: str,
    reason: str,
) -> None:
    """One line on stderr, `file: key: reason`, exit 1, nothing claimed ok, no pasted key echoed."""
    root = tmp_path / "p"
    code, out, err = cli_check(root, files, capsys)
    assert code == 1
    assert out == ""
    assert err.endswith("\n")
    assert err.count("\n") == 1
    assert err.startswith(f"policy check failed: {root / name}: {key}: ")
    assert reason in err
    assert RAW_KEY not in err
    assert ACME_DIGEST not in err


def test_policy_check_accepts_mode_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mode: off` (which YAML alone would read as false) passes and is reported as off."""
    code, out, err = cli_check(tmp_path / "p", with_default("acme.yaml", acme("mode: off\n")), capsys)
    assert (code, err) == (0, "")
    assert f"ok  {tmp_path / 'p' / 'acme.yaml'}  tenant=acme mode=off " in out
