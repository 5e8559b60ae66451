"""The documentation against the code: README.md and docs/*.md name only what exists.

Pure and fast: reads files and the CLI's argparse tree, starts nothing.

(a) Every `python -m ext_proc …` command named in a doc is a command of the CLI (each subcommand
    word, and each `--option` written after it, exists in the argparse tree of
    `ext_proc.__main__.build_parser`); every other `python -m tests.…`/`ext_proc.…` module named
    exists; every `make TARGET` written as code is a target of the Makefile.
(b) Environment variables. The documented set is the first column of the tables in
    docs/configuration.md; the code's set is every name ext_proc/ reads (`os.environ[…]`,
    `os.environ.get/setdefault(…)`, `os.getenv(…)`, `env.get/setdefault(…)` and the settings
    helpers `_int(env, "NAME", …)`). The two must be equal. And every UPPER_SNAKE token (two or
    more parts) anywhere in the docs must be one of: a variable the code reads, a Makefile or
    test-suite variable, a catalog kind or a placeholder label built from one, a constant defined
    in ext_proc/, or one of the few names in NOT_OURS (each with its reason). So a doc cannot
    name a variable nobody reads, and a variable cannot be added to the code undocumented.
(c) Every relative link (and image) in the docs resolves to a file of the repository, and an
    `#anchor` to a heading of the target page (GitHub's slug rules).
(d) No doc cites what a reader does not have: `SPEC`, `§`, `NOTES.md`, `../shared`, `issue <n>`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from ext_proc.__main__ import build_parser
from ext_proc.detect.findings import CATALOG_KINDS
from ext_proc.detect.subjects.header import KINDS as SUBJECT_KINDS

ROOT = Path(__file__).resolve().parents[2]
DOCS: tuple[Path, ...] = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
CONFIGURATION = ROOT / "docs" / "configuration.md"

# UPPER_SNAKE names in the docs that are neither read by ext_proc nor defined by this repository.
NOT_OURS = {
    "OPENAI_BASE_URL": "the openai SDK's own variable",
    "ANTHROPIC_BASE_URL": "the anthropic SDK's own variable",
    "SO_REUSEPORT": "a socket option",
    "OPENAI_API_KEY": "catalog.md: a variable name, given as an example of a key that is not a secret",
    "ANTHROPIC_API_KEY": "catalog.md: as above",
    "DB_PASSWORD": "catalog.md: an example of a secret assignment in an environment file",
    "DENY_TERM": "the kind of a policy's deny terms (ext_proc.detect.catalog.deny.DENY_KIND)",
    "ALLOWED_IP": "the receipt count of a kind under `actions: allow` (ALLOWED_PREFIX + kind)",
    "EMPLOYEE_ID": "policies.md, catalog.md: an example custom kind",
    "PROJECT_NIGHTINGALE": "catalog.md: an example deny term, written in capitals",
}

FORBIDDEN = [
    (re.compile(r"\bSPEC\b"), "a SPEC reference"),
    (re.compile("§"), "a section sign"),
    (re.compile(r"NOTES\.md"), "NOTES.md"),
    (re.compile(r"\.\./shared"), "../shared"),
    (re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE), "an issue number"),
]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_UPPER_SNAKE = re.compile(r"(?<![A-Za-z0-9_])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![A-Za-z0-9_])")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _code(text: str) -> Iterator[str]:
    """The code of a page: its fenced blocks and its inline code spans."""
    for block in _FENCE.finditer(text):
        yield block.group(0)
    for span in _INLINE_CODE.finditer(_FENCE.sub("", text)):
        yield span.group(0).strip("`")


def _prose(text: str) -> str:
    """A page without its code (links are not links inside code)."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- (a) commands ------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _positional_choices(parser: argparse.ArgumentParser) -> set[str] | None:
    for action in parser._actions:
        if (
            not action.option_strings
            and action.choices
            and not isinstance(action, argparse._SubParsersAction)
        ):
            return {str(choice) for choice in action.choices}
    return None


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


_CLI = re.compile(r"python -m ext_proc((?:[ \t]+[^\s`#<>]+)*)")


def check_cli_command(words: list[str]) -> str | None:
    """None if `python -m ext_proc WORDS…` names an existing command and its options; else why not."""
    parser = build_parser()
    path = ["python -m ext_proc"]
    resolved = False
    for raw in words:
        word = raw.strip("[](),.;:")
        if not word or word in {"…", "...", "|"}:
            continue
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            if option not in _options(parser):
                return f"`{' '.join(path)}` has no option {option}"
            continue
        if resolved:
            continue  # an argument (DIR, FILE, a value)
        commands = _subparsers(parser)
        if commands:
            if word not in commands:
                return f"`{' '.join(path)}` has no command {word!r}"
            parser = commands[word]
            path.append(word)
            continue
        choices = _positional_choices(parser)
        if choices is not None:
            unknown = [part for part in word.split("|") if part not in choices]
            if unknown:
                return f"`{' '.join(path)}` takes {sorted(choices)}, not {unknown}"
        resolved = True
    if _subparsers(parser):
        return f"`{' '.join(path)}` needs one of {sorted(_subparsers(parser))}"
    return None


def cli_problems(path: Path, text: str) -> list[str]:
    problems = []
    for snippet in _code(text):
        for m in _CLI.finditer(snippet):
            words = m.group(1).split()
            # `python -m ext_proc` alone, or followed by `…`: the tool, not a command.
            if not [w for w in words if w.strip("[](),.;:") not in ("", "…", "...")]:
                continue
            problem = check_cli_command(words)
            if problem:
                problems.append(f"{_where(path)}: {problem}")
    return problems


_MODULE = re.compile(r"python -m ((?:tests|ext_proc)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def module_problems(path: Path, text: str) -> list[str]:
    problems = []
    for snippet in _code(text):
        for m in _MODULE.finditer(snippet):
            module = m.group(1)
            base = ROOT.joinpath(*module.split("."))
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                problems.append(f"{_where(path)}: no module {module}")
    return problems


@cache
def make_targets() -> frozenset[str]:
    makefile = _read(ROOT / "Makefile")
    return frozenset(re.findall(r"^([A-Za-z][A-Za-z0-9_-]*)\s*:(?!=)", makefile, re.MULTILINE))


_MAKE = re.compile(r"(?:^|[\s;(&|])make[ \t]+([a-z][a-z0-9_-]*)")


def make_problems(path: Path, text: str) -> list[str]:
    targets = make_targets()
    return [
        f"{_where(path)}: `make {m.group(1)}` is not a Makefile target"
        for snippet in _code(text)
        for m in _MAKE.finditer(snippet)
        if m.group(1) not in targets
    ]


# --- (b) environment variables -----------------------------------------------------------------

_ENV_READS = [
    re.compile(r"environ\[\s*[\"']([A-Z][A-Z0-9_]*)[\"']\s*\]"),
    re.compile(r"environ\.(?:get|setdefault)\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']"),
    re.compile(r"getenv\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']"),
    re.compile(r"\benv\.(?:get|setdefault)\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']"),
    re.compile(r"\(\s*env\s*,\s*[\"']([A-Z][A-Z0-9_]*)[\"']"),
]


def env_reads(root: Path) -> set[str]:
    """Every environment variable the Python files under `root` read."""
    names: set[str] = set()
    for source in root.rglob("*.py"):
        text = _read(source)
        for pattern in _ENV_READS:
            names.update(pattern.findall(text))
    return names


@cache
def code_env() -> frozenset[str]:
    return frozenset(env_reads(ROOT / "ext_proc"))


def documented_env(text: str) -> set[str]:
    """The variables in the first column of the tables of docs/configuration.md."""
    names: set[str] = set()
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not line.lstrip().startswith("|"):
            continue
        names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1]))
    return names


@cache
def known_names() -> frozenset[str]:
    """UPPER_SNAKE names the docs may use besides the variables ext_proc reads."""
    makefile = set(re.findall(r"\$[({]{1,2}([A-Z][A-Z0-9_]*)", _read(ROOT / "Makefile")))
    suite = env_reads(ROOT / "tests")
    constants: set[str] = set()
    for source in (ROOT / "ext_proc").rglob("*.py"):
        constants.update(re.findall(r"^([A-Z][A-Z0-9_]*)\s*[:=]", _read(source), re.MULTILINE))
    return frozenset(makefile | suite | constants | set(CATALOG_KINDS) | set(NOT_OURS))


_SUBJECT_LABELS = "|".join(SUBJECT_KINDS)
_CATALOG_LABELS = "|".join(CATALOG_KINDS)
_LABEL = re.compile(rf"(?:SUBJECT\d*_(?:{_SUBJECT_LABELS})|(?:{_CATALOG_LABELS})_[0-9A-F]+)")


def unknown_names(text: str) -> set[str]:
    """UPPER_SNAKE tokens of a page that name nothing this repository reads or defines."""
    allowed = code_env() | known_names()
    return {name for name in _UPPER_SNAKE.findall(text) if name not in allowed and not _LABEL.fullmatch(name)}


# --- (c) links ---------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    result = set()
    for m in _HEADING.finditer(_FENCE.sub("", _read(path))):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return frozenset(result)


def link_problems(path: Path, text: str) -> list[str]:
    problems = []
    for m in _LINK.finditer(_prose(text)):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
            problems.append(f"{_where(path)}: link {target} leads to no file")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{_where(path)}: link {target}: no heading #{anchor} there")
    return problems


# --- (d) references a reader does not have -----------------------------------------------------


def reference_problems(path: Path, text: str) -> list[str]:
    return [
        f"{_where(path)}:{text.count(chr(10), 0, m.start()) + 1}: {what} ({m.group(0)!r})"
        for pattern, what in FORBIDDEN
        for m in pattern.finditer(text)
    ]


# --- the tests ---------------------------------------------------------------------------------


def test_the_docs_are_there() -> None:
    assert ROOT / "README.md" in DOCS and CONFIGURATION in DOCS and len(DOCS) > 5


@pytest.mark.parametrize("path", DOCS, ids=_where)
def test_every_command_named_exists(path: Path) -> None:
    text = _read(path)
    assert cli_problems(path, text) + module_problems(path, text) + make_problems(path, text) == []


def test_the_scanner_of_environment_reads_finds_the_settings() -> None:
    # Guards the scanner itself: were it to find nothing, the next test would compare two empty sets.
    assert {"LISTEN_PORT", "REDIS_URL", "TENANT_SECRET", "LOG_LEVEL", "OMP_THREAD_LIMIT"} <= code_env()


def test_configuration_documents_exactly_the_variables_the_code_reads() -> None:
    documented = documented_env(_read(CONFIGURATION))
    assert {"undocumented": sorted(code_env() - documented), "not read": sorted(documented - code_env())} == {
        "undocumented": [],
        "not read": [],
    }


@pytest.mark.parametrize("path", DOCS, ids=_where)
def test_every_variable_named_is_read_or_known(path: Path) -> None:
    assert sorted(unknown_names(_read(path))) == []


@pytest.mark.parametrize("path", DOCS, ids=_where)
def test_every_relative_link_resolves(path: Path) -> None:
    assert link_problems(path, _read(path)) == []


@pytest.mark.parametrize("path", [*DOCS, ROOT / "CHANGELOG.md"], ids=_where)
def test_no_reference_to_what_a_reader_does_not_have(path: Path) -> None:
    assert reference_problems(path, _read(path)) == []


# --- the checks can fail -----------------------------------------------------------------------


def test_the_checks_catch_planted_errors() -> None:
    page = ROOT / "docs" / "planted.md"  # never written: the checks take the text as given
    assert check_cli_command(["receipts", "verfy"]) is not None
    assert check_cli_command(["scan", "--json"]) is not None
    assert check_cli_command(["policy"]) is not None
    assert check_cli_command(["stack", "run|start"]) is not None
    assert check_cli_command(["receipts", "verify", "[--tenant", "T]", "--file", "F"]) is None
    assert make_problems(page, "run `make tests`") != []
    assert module_problems(page, "`python -m tests.bench.nothing`") != []
    assert unknown_names("set `CORDON_MAGIC_PORT=1`") == {"CORDON_MAGIC_PORT"}
    assert unknown_names("`SUBJECT2_PHONE`, `CREDIT_CARD`, `<EMAIL_3f9a1c2e_1>`") == set()
    assert documented_env("| `A_B` | 1 | x |\n| request | `C_D` |") == {"A_B"}
    assert link_problems(page, "[x](nowhere.md)") != []
    assert link_problems(page, "[x](policies.md#no-such-heading)") != []
    assert link_problems(page, "[x](policies.md#reload) `[y](code.md)`") == []
    assert reference_problems(page, "see SPEC §3 and issue 4") != []
    assert reference_problems(page, "the Compose Specification; issues are tracked") == []
    assert slug("Declaring who a request is about: `X-Cordon-Subject`") == (
        "declaring-who-a-request-is-about-x-cordon-subject"
    )
