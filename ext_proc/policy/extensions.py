"""The policy keys that extend the catalog: `customKinds`, `allow`, `deny` and `actions`.

Where this sits: `ext_proc.policy.load` hands these four keys of a file here and gets one
`Extensions` value back (ext_proc.detect.catalog.extensions), which the tenant's catalog compiles.
Every problem is a `PolicyError` naming the file, the key (with the entry's index) and the reason;
a custom kind's pattern is compiled and run against adversarial texts here, so a pattern that
would stall requests is refused when the file is checked, not when traffic meets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ext_proc.detect.catalog.deny import DENY_KIND, MAX_TERM_CHARS, term_key
from ext_proc.detect.catalog.extensions import (
    ACTIONS,
    CUSTOM_VALIDATORS,
    CustomKind,
    Extensions,
    PatternProblem,
    check_name,
    compile_checked,
)
from ext_proc.detect.findings import CATALOG_KINDS
from ext_proc.policy.model import PolicyError

EXTENSION_KEYS: tuple[str, ...] = ("customKinds", "allow", "deny", "actions")
MAX_CUSTOM_KINDS = 200
MAX_ENTRIES = 100_000
MAX_VALUE_CHARS = 1000
_KIND_KEYS = ("name", "pattern", "validate", "context", "minLength")


def _list(source: Path, key: str, value: object) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PolicyError(source, key, "must be a list")
    if len(value) > MAX_ENTRIES:
        raise PolicyError(source, key, f"holds more than {MAX_ENTRIES:,} entries")
    return value


def _pattern(source: Path, key: str, text: object) -> str:
    if not isinstance(text, str) or not text:
        raise PolicyError(source, key, "must be a non-empty regex")
    try:
        compile_checked(text)
    except PatternProblem as exc:
        raise PolicyError(source, key, str(exc)) from None
    return text


def _custom_kind(source: Path, index: int, entry: object) -> CustomKind:
    at = f"customKinds[{index}]"
    if not isinstance(entry, Mapping):
        raise PolicyError(source, at, "must be a mapping with name and pattern")
    for field in entry:
        if field not in _KIND_KEYS:
            raise PolicyError(source, f"{at}.{field}", "unknown key; known: " + ", ".join(_KIND_KEYS))
    name = entry.get("name")
    if not isinstance(name, str):
        raise PolicyError(source, f"{at}.name", "is required: an UPPER_SNAKE kind name")
    problem = check_name(name)
    if problem is not None:
        raise PolicyError(source, f"{at}.name", problem)
    pattern = _pattern(source, f"{at}.pattern", entry.get("pattern"))
    validate = entry.get("validate", "none")
    if validate not in CUSTOM_VALIDATORS:
        raise PolicyError(
            source, f"{at}.validate", "unknown validator; known: " + ", ".join(CUSTOM_VALIDATORS)
        )
    context = entry.get("context", [])
    if not isinstance(context, list) or not all(isinstance(w, str) and w.strip() for w in context):
        raise PolicyError(source, f"{at}.context", "must be a list of words")
    min_length = entry.get("minLength", 0)
    if not isinstance(min_length, int) or isinstance(min_length, bool) or not 0 <= min_length <= 1000:
        raise PolicyError(source, f"{at}.minLength", "must be a whole number from 0 to 1000")
    words = tuple(sorted({w.strip().casefold() for w in context}))
    return CustomKind(name, pattern, str(validate), words, min_length)


def _custom_kinds(source: Path, value: object) -> tuple[CustomKind, ...]:
    entries = _list(source, "customKinds", value)
    if len(entries) > MAX_CUSTOM_KINDS:
        raise PolicyError(source, "customKinds", f"holds more than {MAX_CUSTOM_KINDS} kinds")
    kinds = tuple(_custom_kind(source, i, entry) for i, entry in enumerate(entries))
    seen: set[str] = set()
    for i, kind in enumerate(kinds):
        if kind.name in seen:
            raise PolicyError(source, f"customKinds[{i}].name", f"{kind.name} is defined twice")
        seen.add(kind.name)
    return kinds


def _allow(source: Path, value: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    values: list[str] = []
    patterns: list[str] = []
    for i, entry in enumerate(_list(source, "allow", value)):
        at = f"allow[{i}]"
        if isinstance(entry, str):
            if not entry.strip() or len(entry) > MAX_VALUE_CHARS:
                raise PolicyError(source, at, f"must be a value of 1 to {MAX_VALUE_CHARS} characters")
            values.append(entry)
        elif isinstance(entry, Mapping) and set(entry) == {"re"}:
            patterns.append(_pattern(source, f"{at}.re", entry["re"]))
        else:
            raise PolicyError(source, at, "must be a value or a mapping {re: 'regex'}")
    return tuple(sorted(set(values))), tuple(dict.fromkeys(patterns))


def _deny(source: Path, value: object) -> tuple[str, ...]:
    terms: list[str] = []
    for i, entry in enumerate(_list(source, "deny", value)):
        if not isinstance(entry, str) or len(entry) > MAX_TERM_CHARS:
            raise PolicyError(source, f"deny[{i}]", f"must be a term of at most {MAX_TERM_CHARS} characters")
        if len(term_key(entry)) < 2:
            raise PolicyError(source, f"deny[{i}]", "must hold at least two letters or digits")
        terms.append(entry)
    return tuple(sorted(set(terms)))


def _actions(source: Path, value: object, custom: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise PolicyError(source, "actions", "must be a mapping of kind to redact, block or allow")
    known = (*CATALOG_KINDS, *custom, DENY_KIND)
    out: list[tuple[str, str]] = []
    for kind, action in value.items():
        at = f"actions.{kind}"
        if kind not in known:
            raise PolicyError(
                source, at, "unknown kind; known: the catalog's kinds, customKinds and DENY_TERM"
            )
        if action not in ACTIONS:
            raise PolicyError(source, at, "must be one of " + ", ".join(ACTIONS))
        if kind == DENY_KIND and action == "allow":
            raise PolicyError(source, at, "deny terms are always redacted (or blocked)")
        if action != "redact":
            out.append((str(kind), str(action)))
    return tuple(sorted(out))


def parse_extensions(source: Path, written: Mapping[str, object]) -> Extensions:
    """The `Extensions` of the extension keys written in a file (absent keys: nothing added)."""
    kinds = _custom_kinds(source, written.get("customKinds"))
    values, patterns = _allow(source, written.get("allow"))
    return Extensions(
        custom_kinds=kinds,
        allow_values=values,
        allow_patterns=patterns,
        deny=_deny(source, written.get("deny")),
        actions=_actions(source, written.get("actions"), tuple(k.name for k in kinds)),
    )


def extensions_record(extensions: Extensions) -> dict[str, object]:
    """`extensions` as JSON-ready data (the policy snapshot)."""
    return {
        "custom_kinds": [
            [k.name, k.pattern, k.validate, list(k.context), k.min_length] for k in extensions.custom_kinds
        ],
        "allow_values": list(extensions.allow_values),
        "allow_patterns": list(extensions.allow_patterns),
        "deny": list(extensions.deny),
        "actions": [list(pair) for pair in extensions.actions],
    }


def extensions_from_record(record: Mapping[str, Any]) -> Extensions:
    """The inverse of `extensions_record`."""
    kinds = tuple(
        CustomKind(str(name), str(pattern), str(validate), tuple(map(str, context)), int(min_length))
        for name, pattern, validate, context, min_length in record["custom_kinds"]
    )
    return Extensions(
        custom_kinds=kinds,
        allow_values=tuple(map(str, record["allow_values"])),
        allow_patterns=tuple(map(str, record["allow_patterns"])),
        deny=tuple(map(str, record["deny"])),
        actions=tuple((str(kind), str(action)) for kind, action in record["actions"]),
    )
