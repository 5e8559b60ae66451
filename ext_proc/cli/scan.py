"""`python -m ext_proc scan`: the catalog on the command line.

Where it sits: outside the request path. Platform teams pipe their own samples through it to see
what a policy's catalog would redact, and the conformance runner (`tests/support/conformance.py`) feeds
it the peer corpus. It prints kinds and offsets (Python `str` code points), never a value: not
on stdout, not on stderr.

    scan [--sets pii,pci,secrets | --policy FILE]            text on stdin → one finding per line
    (with --policy, a finding of a kind the policy blocks or allows carries `"action"`)
    scan --jsonl [--sets … | --policy FILE]                  {"text": …} lines → {"findings": […]}

With `--policy`, a policy whose `media` is `mask` or `block` gets a note on stderr: scan reads
text only and runs no OCR, so it cannot show what the server does with a request's images.

Blank `--jsonl` lines are skipped. Declared subjects (a non-null `"subject"` in a line) stop
the run with exit status 2 until the subject matchers exist (lines before it are answered):
reporting catalog findings alone for such a line would understate what the server redacts.
Exit status 1 is a detection failure (a regex timeout), reported without the text.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, TextIO

from ext_proc.detect.findings import ALL_SETS, Finding
from ext_proc.errors import DetectionError

if TYPE_CHECKING:
    from ext_proc.detect.catalog.engine import Catalog
    from ext_proc.policy.model import Policy

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class _UsageError(Exception):
    """Bad input or arguments; the message never contains scanned text."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jsonl",
        action="store_true",
        help='read {"text": ..., "subject": ...} lines, write {"findings": [...]} lines in order',
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--sets",
        default=None,
        help=f"comma-separated catalog sets (default: {','.join(ALL_SETS)})",
    )
    source.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help="use this policy file's sets, documentation-IP switch, customKinds, allow, deny and actions",
    )


def run(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    try:
        catalog, policy = _catalog(args)
        if policy is not None and policy.media in MEDIA_NOTES:
            print(
                f"scan: note: {policy.source}: media: {policy.media}: {MEDIA_NOTES[policy.media]}",
                file=sys.stderr,
            )
        if args.jsonl:
            return _run_jsonl(catalog, stdin, stdout)
        findings = catalog.detect(stdin.read())
        for finding in findings:
            stdout.write(json.dumps(_as_json(finding, catalog)) + "\n")
        return EXIT_OK
    except _UsageError as exc:
        print(f"scan: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DetectionError as exc:
        # The message names the failure (a regex timeout), never the text.
        print(f"scan: detection failed: {exc}", file=sys.stderr)
        return EXIT_ERROR


# What the server does with a request's media under the policy's `media`, which scan cannot show.
MEDIA_NOTES = {
    "mask": (
        "scan reads text only and runs no OCR: the server would also read every image of a request "
        "without declared subjects and paint what this catalog finds there, or refuse the request "
        "(422) when an image cannot be read or masked; try images through the running server"
    ),
    "block": "scan reads text only: the server refuses (422) any request without declared subjects "
    "that carries media",
}


def _catalog(args: argparse.Namespace) -> tuple[Catalog, Policy | None]:
    # Imported here: every command builds this parser (`add_arguments`), and the catalog is only
    # scan's to load.
    from ext_proc.detect.catalog.engine import Catalog

    if getattr(args, "policy", None):
        # Imported here: the policy module is a separate concern and the scan of plain text
        # must not depend on it.
        from ext_proc.policy.load import load_policy_file

        try:
            policy = load_policy_file(args.policy)
        except Exception as exc:  # the policy loader names file, key and reason itself
            raise _UsageError(f"cannot use policy {args.policy}: {exc}") from None
        catalog = Catalog.for_sets(
            policy.sets,
            skip_documentation_ips=bool(policy.skip_documentation_ips),
            extensions=policy.extensions,
        )
        return catalog, policy
    sets_arg = getattr(args, "sets", None)
    sets = ALL_SETS if sets_arg is None else tuple(s.strip() for s in sets_arg.split(",") if s.strip())
    unknown = [s for s in sets if s not in ALL_SETS]
    if unknown:
        raise _UsageError(f"unknown set(s) {', '.join(unknown)}; choose from {', '.join(ALL_SETS)}")
    return Catalog.for_sets(sets), None


def _run_jsonl(catalog: Catalog, stdin: TextIO, stdout: TextIO) -> int:
    for number, line in enumerate(stdin, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise _UsageError(f"line {number}: not a JSON object") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise _UsageError(f'line {number}: expected an object with a string "text"')
        if record.get("subject") is not None:
            raise _UsageError(
                f"line {number}: carries a subject; subject scanning arrives with "
                "declared-subject support (X-Cordon-Subject), not available in this build"
            )
        findings = catalog.detect(record["text"])
        stdout.write(json.dumps({"findings": [_as_json(f, catalog) for f in findings]}) + "\n")
    return EXIT_OK


def _as_json(finding: Finding, catalog: Catalog) -> dict[str, object]:
    out: dict[str, object] = {"kind": finding.kind, "start": finding.start, "end": finding.end}
    action = catalog.extensions.action(finding.kind)
    if action != "redact":
        # The policy's `actions`: the server would refuse the request (block) or leave the value
        # in place and count it (allow).
        out["action"] = action
    return out
