"""Policy files (SPEC §10): a valid directory loads; every invalid one names file, key and reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ext_proc.findings import ALL_SETS
from ext_proc.policy import (
    NOT_YET_SUPPORTED,
    PolicyError,
    hash_api_key,
    load_policy_dir,
    load_policy_file,
)

ROOT = Path(__file__).resolve().parent.parent
ACME_KEY = "sk-acme-0123456789abcdef"  # invented; files store only its digest
ACME_DIGEST = hash_api_key(ACME_KEY)
KNOB_ATTRS = {
    "consistentPseudonyms": "consistent_pseudonyms",
    "requireSubject": "require_subject",
    "reportOnly": "report_only",
    "allowHeaderOverride": "allow_header_override",
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


@pytest.mark.parametrize("written", ["off", "Off", "OFF", '"off"'])
def test_mode_off_written_bare_is_off(tmp_path: Path, written: str) -> None:
    """YAML 1.1 reads a bare `off` as false; the policy still means mode off."""
    policy = load_policy_file(write_dir(tmp_path, {"t.yaml": f"tenant: t\nmode: {written}\n"}) / "t.yaml")
    assert policy.mode == "off"


@pytest.mark.parametrize("knob", sorted(NOT_YET_SUPPORTED))
def test_not_yet_supported_knob_false_is_accepted(tmp_path: Path, knob: str) -> None:
    """Writing a not-yet-supported knob as false is harmless and loads."""
    path = write_dir(tmp_path, {"t.yaml": f"tenant: t\n{knob}: false\n"}) / "t.yaml"
    assert getattr(load_policy_file(path), KNOB_ATTRS[knob]) is False


@pytest.mark.parametrize("knob", sorted(NOT_YET_SUPPORTED))
def test_not_yet_supported_knob_true_is_refused(tmp_path: Path, knob: str) -> None:
    """Turning on a knob this version cannot honour is a load error naming the knob."""
    path = write_dir(tmp_path, {"t.yaml": f"tenant: t\n{knob}: true\n"}) / "t.yaml"
    with pytest.raises(PolicyError) as info:
        load_policy_file(path)
    assert_names(info.value, path, knob, NOT_YET_SUPPORTED[knob])


# --- one bad file: file, key and reason ----------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "key", "reason"),
    [
        ("mdoe: strip\n", "mdoe", "unknown key"),
        ("Mode: strip\n", "Mode", "unknown key"),
        ("1: strip\n", "1", "unknown key"),
        ("mode: 1\n", "mode", "must be one of reversible, strip, off"),
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
        ("requireSubject: 0\n", "requireSubject", "must be true or false"),
        ("subjectMedia: 3\n", "subjectMedia", "must be one of block, mask, allow"),
        ("subjectMedia: hide\n", "subjectMedia", "must be one of"),
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
