"""`python -m ext_proc …` (also the `cordon-ext-proc` console script).

serve           the gRPC server: WORKERS worker processes, worker i on EXTPROC_PORT + i
scan            detect in text from stdin (or --jsonl records); prints findings, never values
policy check    validate a policy directory (for the platform team's CI)
receipts verify re-hash the receipt chains in Redis from their first record (for auditors),
                or an export file offline (--file)
receipts export the chains as JSON lines, as stored (for a SIEM, or verify --file)
stack run|up|down   the whole local stack (what `make run`, `make up`, `make down` call)
bootstrap       render Envoy's bootstrap from the environment (for a containerised Envoy)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ext_proc.runtime.config import ConfigError, Settings


def _settings(args: argparse.Namespace) -> Settings:
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        raise SystemExit(f"configuration error: {exc}") from None
    overrides = {}
    if getattr(args, "workers", None):
        overrides["workers"] = args.workers
    if getattr(args, "port", None):
        overrides["extproc_port"] = args.port
    if overrides:
        from dataclasses import replace

        settings = replace(settings, **overrides)
        try:
            settings.check_extproc_ports()
        except ConfigError as exc:
            raise SystemExit(f"configuration error: {exc}") from None
    return settings


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)  # first: a bad setting stops the command before the heavy imports
    if args.worker_index is None:
        # The supervisor imports none of the worker's modules (see ext_proc.service.supervisor).
        from ext_proc.policy.precheck import PolicyCheckFailed
        from ext_proc.service import supervisor

        try:
            return supervisor.serve(settings)
        except ConfigError as exc:
            raise SystemExit(f"configuration error: {exc}") from None
        except PolicyCheckFailed as exc:
            raise SystemExit(f"policy error: {exc}") from None
    from ext_proc.policy.model import PolicyError
    from ext_proc.service import worker

    try:
        return worker.worker_main(settings, args.worker_index)
    except ConfigError as exc:
        raise SystemExit(f"configuration error: {exc}") from None
    except PolicyError as exc:
        raise SystemExit(f"policy error: {exc}") from None


def cmd_receipts_verify(args: argparse.Namespace) -> int:
    if args.file is not None:
        from ext_proc.audit.receipts.export import verify_file_cli

        return verify_file_cli(args.file, args.tenant)
    from ext_proc.audit.receipts.verify import verify_cli

    settings = _settings(args)
    return verify_cli(settings.effective_redis_url, args.tenant, timeout=args.timeout)


def cmd_receipts_export(args: argparse.Namespace) -> int:
    from ext_proc.audit.receipts.export import export_cli

    settings = _settings(args)
    return export_cli(settings.effective_redis_url, args.tenant, args.since, timeout=args.timeout)


def cmd_scan(args: argparse.Namespace) -> int:
    from ext_proc.cli import scan

    return scan.run(args, sys.stdin, sys.stdout)


def cmd_policy_check(args: argparse.Namespace) -> int:
    from ext_proc.policy.load import load_policy_dir
    from ext_proc.policy.model import PolicyError

    try:
        policies = load_policy_dir(args.directory)
    except PolicyError as exc:
        print(f"policy check failed: {exc}", file=sys.stderr)
        return 1
    for policy in policies.tenants.values():
        print(f"ok  {policy.source}  tenant={policy.tenant} mode={policy.mode} sets={','.join(policy.sets)}")
    return 0


def cmd_stack(args: argparse.Namespace) -> int:
    settings = _settings(args)
    from ext_proc.runtime import stack

    if args.action == "run":
        return stack.run(settings, quiet=args.quiet)
    if args.action == "up":
        return stack.up(settings)
    return stack.down(settings)


def cmd_bootstrap(args: argparse.Namespace) -> int:
    """Envoy's bootstrap as `make run` renders it, for an Envoy started by something else (a
    container, a pod). Unset upstreams are the fake upstream on FAKE_UPSTREAM_PORT, as in the
    stack; TLS_CERT_FILE/TLS_KEY_FILE are written as given (paths inside the Envoy container),
    else a self-signed pair is made once under RUN_DIR/tls."""
    from ext_proc.runtime import bootstrap
    from ext_proc.runtime.config import parse_upstream
    from ext_proc.runtime.files import write_atomically

    settings = _settings(args)
    fake = f"http://127.0.0.1:{settings.fake_upstream_port}"
    cert, key, _ca = bootstrap.ensure_tls_material(settings)
    config = bootstrap.render(
        settings,
        openai=settings.openai_upstream or parse_upstream("openai", fake),
        anthropic=settings.anthropic_upstream or parse_upstream("anthropic", fake),
        # absolute(), not resolve(): the paths are the container's, not this machine's symlinks.
        cert=cert.absolute(),
        key=key.absolute(),
    )
    if args.output is None:
        sys.stdout.write(config)
    else:
        write_atomically(Path(args.output), config)
        if settings.envoy_access_log is None:  # Envoy opens its access log's file at start
            settings.access_log_path.parent.mkdir(parents=True, exist_ok=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ext_proc.cli import scan

    parser = argparse.ArgumentParser(prog="python -m ext_proc", description="Cordon privacy filter")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the ext_proc gRPC server")
    serve.add_argument("--workers", type=int, help="worker processes (default: WORKERS or the core count)")
    serve.add_argument(
        "--port", type=int, help="worker 0's gRPC port; worker i listens on PORT + i (default: EXTPROC_PORT)"
    )
    serve.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    scan_parser = commands.add_parser("scan", help="print findings for text on stdin")
    scan.add_arguments(scan_parser)
    scan_parser.set_defaults(func=cmd_scan)

    policy = commands.add_parser("policy", help="policy files")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_commands.add_parser("check", help="validate every policy file of a directory")
    check.add_argument("directory")
    check.set_defaults(func=cmd_policy_check)

    receipts = commands.add_parser("receipts", help="receipt chains in Redis (REDIS_URL)")
    receipt_commands = receipts.add_subparsers(dest="receipts_command", required=True)
    verify = receipt_commands.add_parser(
        "verify", help="re-hash every chain (or one) from its first record; exit 1 if one is broken"
    )
    verify.add_argument("--tenant", help="verify only this tenant's chain")
    verify.add_argument("--file", help="verify an export (receipts export) offline instead of Redis")
    verify.add_argument("--timeout", type=float, default=5.0, help="seconds per Redis call (default 5)")
    verify.set_defaults(func=cmd_receipts_verify)
    export = receipt_commands.add_parser(
        "export", help="write every chain (or one) as JSON lines, as stored, for verify --file or a SIEM"
    )
    export.add_argument("--tenant", help="export only this tenant's chain")
    export.add_argument("--since", help="only the records appended since this RFC 3339 time or date")
    export.add_argument("--timeout", type=float, default=5.0, help="seconds per Redis call (default 5)")
    export.set_defaults(func=cmd_receipts_export)

    stack_parser = commands.add_parser("stack", help="run the local stack (make run / up / down)")
    stack_parser.add_argument("action", choices=["run", "up", "down"])
    stack_parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    stack_parser.set_defaults(func=cmd_stack)

    bootstrap_parser = commands.add_parser("bootstrap", help="render Envoy's bootstrap from the environment")
    bootstrap_parser.add_argument("--output", help="write it to this file (default: stdout)")
    bootstrap_parser.set_defaults(func=cmd_bootstrap)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ext_proc.runtime import logs

    args = build_parser().parse_args(argv)
    # Only the commands that run services read the settings: `policy check` and `scan` must work
    # whatever else the environment holds. Log lines are JSON with `ts` and `level`.
    logs.setup()
    if args.command != "serve":
        return int(args.func(args))
    try:
        return int(args.func(args))
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        # A service that cannot start says why in its log, as a log line like any other.
        logging.getLogger("cordon").critical(json.dumps({"event": "startup_failed", "reason": exc.code}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
