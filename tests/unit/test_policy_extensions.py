"""customKinds, allow, deny and actions: parsing, validation, strictness, the compiled deny list,
the catalog they extend, and the actions applied to findings."""

from __future__ import annotations

import io
import json
import time
from argparse import Namespace
from collections import Counter
from pathlib import Path

import pytest

from ext_proc.cli import scan
from ext_proc.detect.catalog.deny import DenyList
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.catalog.extensions import CustomKind, Extensions, runaway_witness
from ext_proc.detect.catalog.regexes import compile_pattern
from ext_proc.detect.catalog.validators import luhn_valid
from ext_proc.detect.findings import ALL_SETS, Finding
from ext_proc.policy.load import load_policy_dir, load_policy_file
from ext_proc.policy.model import Policy, PolicyError
from ext_proc.policy.snapshot import dump_policy_set, load_policy_snapshot
from ext_proc.policy.strictness import less_strict_knobs
from ext_proc.transform.actions import KindBlocked, apply_actions

EMPLOYEE = CustomKind("EMPLOYEE_ID", r"EMP-\d{6}", context=("employee", "staff"))
TICKET = CustomKind("TICKET", r"TCK-\d{4,8}", min_length=8)

# (knob, a less strict value, a stricter value), for the strictness table of test_policy.py.
EXTENSION_STRICTER: list[tuple[str, object, object]] = [
    ("customKinds", Extensions(), Extensions(custom_kinds=(EMPLOYEE,))),
    ("customKinds", Extensions(custom_kinds=(TICKET,)), Extensions(custom_kinds=(TICKET, EMPLOYEE))),
    ("allow", Extensions(allow_values=("help@corp.example",)), Extensions()),
    ("allow", Extensions(allow_patterns=(r"10\.\d+",)), Extensions()),
    ("deny", Extensions(), Extensions(deny=("Project Lark",))),
    ("actions", Extensions(actions=(("IP", "allow"),)), Extensions()),
    ("actions", Extensions(), Extensions(actions=(("CREDIT_CARD", "block"),))),
    ("actions", Extensions(actions=(("IP", "allow"),)), Extensions(actions=(("IP", "block"),))),
]

# Less strict than STRICTEST_EXTENSIONS on all four keys.
LOOSEST_EXTENSIONS = Extensions(allow_values=("help@corp.example",), actions=(("IP", "allow"),))
STRICTEST_EXTENSIONS = Extensions(custom_kinds=(EMPLOYEE,), deny=("Project Lark",))

POLICY = """\
tenant: acme
customKinds:
  - name: EMPLOYEE_ID
    pattern: 'EMP-\\d{6}'
    validate: none
    context: [Employee, staff]
  - name: LOYALTY_CARD
    pattern: '\\b\\d{4} \\d{4} \\d{4}\\b'
    validate: luhn
  - name: CONTRACT
    pattern: 'CT\\d{2}[A-Z0-9]{6}'
    validate: mod97
    minLength: 10
allow:
  - Help@Corp.example
  - re: '10\\.20\\.\\d{1,3}\\.\\d{1,3}'
deny:
  - Project Lark
  - Bluebird
actions:
  CREDIT_CARD: block
  IP: allow
"""


def write(tmp_path: Path, body: str, name: str = "acme.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def load(tmp_path: Path, body: str) -> Policy:
    return load_policy_file(write(tmp_path, body))


def refused(tmp_path: Path, body: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load(tmp_path, body)
    assert info.value.source == str(tmp_path / "acme.yaml")
    return info.value


def kinds(catalog: Catalog, text: str) -> list[tuple[str, str]]:
    return [(f.kind, text[f.start : f.end]) for f in catalog.detect(text)]


def mod97_valid(prefix: str) -> str:
    """`prefix` + two check digits that make the value pass ISO 7064 MOD 97-10."""
    number = int("".join(str(int(c, 36)) for c in prefix) + "00")
    return prefix + f"{98 - number % 97:02d}"


# --- parsing ---------------------------------------------------------------------------------------


def test_a_full_policy_parses(tmp_path: Path) -> None:
    policy = load(tmp_path, POLICY)
    ext = policy.extensions
    assert ext.kind_names == ("EMPLOYEE_ID", "LOYALTY_CARD", "CONTRACT")
    assert ext.custom_kinds[0].context == ("employee", "staff")
    assert ext.custom_kinds[2].min_length == 10
    assert ext.allow_values == ("Help@Corp.example",)
    assert ext.allow_patterns == (r"10\.20\.\d{1,3}\.\d{1,3}",)
    assert ext.deny == ("Bluebird", "Project Lark")
    assert ext.actions == (("CREDIT_CARD", "block"), ("IP", "allow"))
    assert ext.action("EMAIL") == "redact"


def test_absent_keys_add_nothing(tmp_path: Path) -> None:
    assert not load(tmp_path, "tenant: acme\n").extensions
    assert not load(tmp_path, "tenant: acme\ncustomKinds: []\nallow: []\ndeny: []\nactions: {}\n").extensions


@pytest.mark.parametrize(
    ("body", "key", "reason"),
    [
        ("customKinds: [{name: EMAIL, pattern: 'x\\d+'}]", "customKinds[0].name", "built-in kind"),
        ("customKinds: [{name: DENY_TERM, pattern: 'x\\d+'}]", "customKinds[0].name", "built-in kind"),
        ("customKinds: [{name: employee_id, pattern: 'x\\d+'}]", "customKinds[0].name", "UPPER_SNAKE"),
        ("customKinds: [{name: SUBJECT_X, pattern: 'x\\d+'}]", "customKinds[0].name", "reserved"),
        ("customKinds: [{name: ALLOWED_X, pattern: 'x\\d+'}]", "customKinds[0].name", "reserved"),
        ("customKinds: [{pattern: 'x\\d+'}]", "customKinds[0].name", "required"),
        ("customKinds: [{name: ABC, pattern: 'x(\\d+'}]", "customKinds[0].pattern", "not a valid regex"),
        ("customKinds: [{name: ABC, pattern: 'x?'}]", "customKinds[0].pattern", "empty string"),
        (
            "customKinds: [{name: ABC, pattern: '(a+)+$'}]",
            "customKinds[0].pattern",
            "backtracks catastrophically",
        ),
        (
            "customKinds: [{name: ABC, pattern: '(?:[a-z]+\\.)+[a-z]{2,}'}]",
            "customKinds[0].pattern",
            "backtracks catastrophically",
        ),
        (  # runs away only after its literal prefix
            "customKinds: [{name: ABC, pattern: 'REF-(?:\\d|\\d\\d)+#'}]",
            "customKinds[0].pattern",
            "backtracks catastrophically",
        ),
        (
            "customKinds: [{name: ABC, pattern: '(?:EMP|E)(?:-|)(?:\\d|\\d\\d)+\\$'}]",
            "customKinds[0].pattern",
            "backtracks catastrophically",
        ),
        (  # the prefix is two stretches of the source, around a group's end
            "customKinds: [{name: ABC, pattern: '(ID)-(\\w+\\s?)+;'}]",
            "customKinds[0].pattern",
            "backtracks catastrophically",
        ),
        (
            "customKinds: [{name: ABC, pattern: 'x\\d+', validate: crc32}]",
            "customKinds[0].validate",
            "unknown validator",
        ),
        (
            "customKinds: [{name: ABC, pattern: 'x\\d+', context: employee}]",
            "customKinds[0].context",
            "list of words",
        ),
        (
            "customKinds: [{name: ABC, pattern: 'x\\d+', minLength: -1}]",
            "customKinds[0].minLength",
            "whole number",
        ),
        ("customKinds: [{name: ABC, pattern: 'x\\d+', colour: red}]", "customKinds[0].colour", "unknown key"),
        (
            "customKinds: [{name: ABC, pattern: 'x\\d+'}, {name: ABC, pattern: 'y\\d+'}]",
            "customKinds[1].name",
            "defined twice",
        ),
        ("customKinds: {name: ABC}", "customKinds", "must be a list"),
        ("allow: [{re: '(a|aa)+b'}]", "allow[0].re", "backtracks catastrophically"),
        ("allow: [{regex: 'x'}]", "allow[0]", "mapping {re:"),
        ("allow: ['']", "allow[0]", "a value of 1 to"),
        ("deny: ['--']", "deny[0]", "two letters or digits"),
        ("deny: [12]", "deny[0]", "a term"),
        ("actions: {NOT_A_KIND: block}", "actions.NOT_A_KIND", "unknown kind"),
        ("actions: {IP: drop}", "actions.IP", "redact, block, allow"),
        ("actions: {DENY_TERM: allow}", "actions.DENY_TERM", "always redacted"),
        ("actions: [IP]", "actions", "must be a mapping"),
        (
            "consistentPseudonyms: true\ncustomKinds: [{name: ABC, pattern: 'x\\d+'}]",
            "customKinds",
            "consistentPseudonyms",
        ),
    ],
)
def test_a_bad_entry_names_file_key_and_reason(tmp_path: Path, body: str, key: str, reason: str) -> None:
    error = refused(tmp_path, f"tenant: acme\n{body}\n")
    assert error.key == key
    assert reason in error.reason


def test_actions_may_name_a_custom_kind_and_deny_terms(tmp_path: Path) -> None:
    body = (
        "tenant: acme\ncustomKinds: [{name: ABC, pattern: 'x\\d+'}]\n"
        "actions: {ABC: block, DENY_TERM: block}\n"
    )
    assert load(tmp_path, body).extensions.actions == (("ABC", "block"), ("DENY_TERM", "block"))


def test_policy_check_names_file_key_and_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ext_proc.__main__ import main

    write(tmp_path, "tenant: default\n", "default.yaml")
    write(tmp_path, "tenant: acme\ncustomKinds: [{name: ABC, pattern: '(\\w+\\s?)+$'}]\n")
    assert main(["policy", "check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'acme.yaml'}: customKinds[0].pattern: backtracks catastrophically" in err
    assert "repeating" in err  # the adversarial text is shown, as a description


def test_a_linear_pattern_has_no_witness() -> None:
    for source in (
        r"EMP-\d{6}",
        r"[A-Z]{2,5}-\d{3,8}",
        r"\b[a-z0-9-]+\.corp\.example\b",
        r"PRJ-[A-Z]{3}\d++",
    ):
        assert runaway_witness(compile_pattern(source)) is None, source


def test_snapshot_keeps_the_extensions(tmp_path: Path) -> None:
    write(tmp_path, "tenant: default\n", "default.yaml")
    write(tmp_path, POLICY)
    policies = load_policy_dir(tmp_path)
    again = load_policy_snapshot(dump_policy_set(policies))
    assert again.tenants["acme"] == policies.tenants["acme"]


# --- strictness ------------------------------------------------------------------------------------


def test_deny_terms_compare_as_the_deny_list_reads_them() -> None:
    base = Policy(tenant="a", extensions=Extensions(deny=("Project Lark",)))
    same = Policy(tenant="b", extensions=Extensions(deny=("project-LARK", "Bluebird")))
    assert less_strict_knobs(same, base) == []
    assert less_strict_knobs(base, same) == ["deny"]


def test_a_changed_custom_kind_is_not_the_same_kind() -> None:
    base = Policy(tenant="a", extensions=Extensions(custom_kinds=(EMPLOYEE,)))
    looser = Policy(
        tenant="b", extensions=Extensions(custom_kinds=(CustomKind("EMPLOYEE_ID", r"EMP-\d{7}"),))
    )
    assert less_strict_knobs(looser, base) == ["customKinds"]


# --- the deny list ---------------------------------------------------------------------------------


DENY = DenyList.compile(["Project Nightingale", "Bluebird", "Q3 Forecast"])


@pytest.mark.parametrize(
    "text",
    [
        "Project Nightingale",
        "PROJECT-NIGHTINGALE",
        "project_nightingale",
        "ProjectNightingale",
        "P r o j e c t  N i g h t i n g a l e",
        "the bluebird deal",
        "see q3-forecast.",
    ],
)
def test_deny_matches_disguises_of_a_term(text: str) -> None:
    assert DENY.find(text)


@pytest.mark.parametrize("text", ["Nightingales sang", "bluebirds", "Project Nightingal", "Q30 Forecast", ""])
def test_deny_is_word_bounded(text: str) -> None:
    assert DENY.find(text) == []


def test_deny_reads_lookalikes_through_the_catalog() -> None:
    catalog = Catalog.for_sets((), extensions=Extensions(deny=("Project Nightingale",)))
    text = "news on Pr\u043eject\u00a0\u00a0Nighting\u0430le\u200b today"  # Cyrillic o and a, NBSPs
    found = catalog.detect(text)
    assert [f.kind for f in found] == ["DENY_TERM"]
    assert text[found[0].start : found[0].end].startswith("Pr")
    assert text[found[0].start : found[0].end].endswith("le")


def test_deny_cost_does_not_grow_with_the_number_of_terms() -> None:
    """1,000 terms cost about what 10 do: one set lookup per word, not a loop over terms."""
    text = " ".join(f"word{i} Lorem ipsum dolor sit amet, consectetur." for i in range(300))
    small = DenyList.compile([f"Codename {i} Alpha" for i in range(10)])
    large = DenyList.compile([f"Codename {i} Alpha" for i in range(1000)])

    def best(deny: DenyList) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            deny.find(text)
            times.append(time.perf_counter() - start)
        return min(times)

    assert best(large) < best(small) * 2 + 0.001


# --- the catalog, extended ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acme(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    policy = load(tmp_path_factory.mktemp("acme"), POLICY)
    return Catalog.for_sets(ALL_SETS, extensions=policy.extensions)


def test_custom_kind_needs_its_context_nearby(acme: Catalog) -> None:
    assert kinds(acme, "Employee EMP-204518 joined") == [("EMPLOYEE_ID", "EMP-204518")]
    assert kinds(acme, "ref EMP-204518") == []
    far = "staff" + " filler" * 10 + " EMP-204518"
    assert kinds(acme, far) == []


def test_custom_validators(acme: Catalog) -> None:
    good = next(f"4929 0000 000{d}" for d in range(10) if luhn_valid(f"49290000000{d}"))
    assert kinds(acme, f"loyalty {good}") == [("LOYALTY_CARD", good)]
    bad = good[:-1] + str((int(good[-1]) + 1) % 10)
    assert kinds(acme, f"loyalty {bad}") == []
    good = mod97_valid("CT12AB34")
    assert kinds(acme, f"contract {good}") == [("CONTRACT", good)]
    bad = good[:-1] + str((int(good[-1]) + 1) % 10)
    assert kinds(acme, f"contract {bad}") == []


def test_allow_values_and_patterns(acme: Catalog) -> None:
    text = "write to help@corp.example or HELP@CORP.EXAMPLE, not rita@corp.example; 10.20.1.2 but 10.21.1.2"
    assert kinds(acme, text) == [("EMAIL", "rita@corp.example"), ("IP", "10.21.1.2")]


def test_allow_never_lets_a_deny_term_through() -> None:
    catalog = Catalog.for_sets((), extensions=Extensions(allow_values=("Bluebird",), deny=("Bluebird",)))
    assert [f.kind for f in catalog.detect("the Bluebird deal")] == ["DENY_TERM"]


def test_custom_kinds_are_read_in_decoded_views(acme: Catalog) -> None:
    text = "staff id EMP%2D204518"
    assert [f.kind for f in acme.detect(text)] == ["EMPLOYEE_ID"]


def test_two_policies_with_the_same_sets_do_not_share_findings() -> None:
    one = Catalog.for_sets(ALL_SETS, extensions=Extensions(deny=("Bluebird",)))
    other = Catalog.for_sets(ALL_SETS)
    assert [f.kind for f in one.detect("the Bluebird deal")] == ["DENY_TERM"]
    assert other.detect("the Bluebird deal") == []


# --- actions -------------------------------------------------------------------------------------------


ACTIONS = Extensions(actions=(("CREDIT_CARD", "block"), ("IP", "allow")))


def test_block_raises_naming_the_kind_only() -> None:
    with pytest.raises(KindBlocked) as info:
        apply_actions([Finding("CREDIT_CARD", 0, 16)], ACTIONS, Counter())
    assert info.value.kind == "CREDIT_CARD"
    assert "CREDIT_CARD" in str(info.value)


def test_allow_keeps_the_value_and_counts_it() -> None:
    counts: Counter[str] = Counter()
    email = Finding("EMAIL", 20, 30)
    assert apply_actions([Finding("IP", 0, 9), email], ACTIONS, counts) == [email]
    assert counts == Counter({"ALLOWED_IP": 1})


def test_actions_never_apply_to_declared_subjects() -> None:
    subject = Finding("CREDIT_CARD", 0, 16, label="SUBJECT1_CARD", priority=1)
    assert apply_actions([subject], ACTIONS, Counter()) == [subject]


def test_scan_applies_the_whole_policy(tmp_path: Path) -> None:
    path = write(tmp_path, POLICY)
    text = "Employee EMP-204518, help@corp.example, 10.9.8.7, card 4111 1111 1111 1111, Project LARK"
    out = io.StringIO()
    assert scan.run(Namespace(jsonl=False, sets=None, policy=str(path)), io.StringIO(text), out) == 0
    found = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(f["kind"], f.get("action")) for f in found] == [
        ("EMPLOYEE_ID", None),
        ("IP", "allow"),
        ("CREDIT_CARD", "block"),
        ("DENY_TERM", None),
    ]


# --- reload ----------------------------------------------------------------------------------------


def test_the_new_keys_hot_reload_and_a_broken_pattern_keeps_the_last_good_file(tmp_path: Path) -> None:
    from ext_proc.policy.load import reload_policy_dir

    write(tmp_path, "tenant: default\n", "default.yaml")
    write(tmp_path, "tenant: acme\ndeny: [Bluebird]\n")
    first = load_policy_dir(tmp_path)
    write(tmp_path, "tenant: acme\ndeny: [Bluebird, Project Lark]\nactions: {IP: allow}\n")
    second, errors = reload_policy_dir(tmp_path, first)
    assert errors == []
    assert second.tenants["acme"].extensions.deny == ("Bluebird", "Project Lark")
    assert second.tenants["acme"].extensions.action("IP") == "allow"
    write(tmp_path, "tenant: acme\ncustomKinds: [{name: ABC, pattern: '(a|aa)+b'}]\n")
    third, errors = reload_policy_dir(tmp_path, second)
    assert [(e.key, "backtracks" in e.reason) for e in errors] == [("customKinds[0].pattern", True)]
    assert third.tenants["acme"] == second.tenants["acme"]


def test_the_output_gate_reads_custom_kinds_and_deny_terms(acme: Catalog) -> None:
    from ext_proc.restore.output_gate import OutputGate

    gate = OutputGate(acme, lambda text: text)
    assert gate.read("The employee EMP-204518 works on project lark.")
    assert gate.counts() == {"DENY_TERM": 1, "EMPLOYEE_ID": 1}
