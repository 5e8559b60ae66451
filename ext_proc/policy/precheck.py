"""The startup policy check, run in a short-lived child for the processes that only start and
watch others.

`serve`'s supervisor and `stack run` refuse to start on a bad policy directory, naming the file,
the key and the reason. Loading the directory imports the detectors and compiles the catalogs, and
a process keeps every module it imports: the supervisors would hold that memory for their whole
life to read one verdict. So they ask `python -m ext_proc.policy.precheck`, which loads the
directory as a worker will and answers the `PolicyError`'s message.

This module imports nothing of the policy package at the top, and must not.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ext_proc.errors import CordonError

# The child's exit code when a policy is invalid; its standard output then holds the message.
INVALID = 3


class PolicyCheckFailed(CordonError, ValueError):
    """The policy directory cannot be served; the message is the `PolicyError`'s (file: key: reason)."""


def check_policy_dir(directory: Path, *, tenant_secret: bool) -> None:
    """Load every policy file of `directory` in a child, with the deployment's check (a policy
    that needs TENANT_SECRET fails without it); PolicyCheckFailed names the first problem."""
    command = [sys.executable, "-m", __name__, str(directory)]
    if tenant_secret:
        command.append("--tenant-secret")
    # Standard error stays this process's: an unexpected failure's log line lands in the same log.
    done = subprocess.run(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, check=False)
    if done.returncode == INVALID:
        raise PolicyCheckFailed(done.stdout.decode("utf-8", errors="replace").strip())
    if done.returncode != 0:
        raise PolicyCheckFailed(
            f"{directory}: the policy check stopped with exit code {done.returncode} (its error is logged)"
        )


def main(argv: list[str]) -> int:
    from ext_proc.policy.load import deployment_check, load_policy_dir
    from ext_proc.policy.model import PolicyError
    from ext_proc.runtime import logs

    logs.setup()
    # A terminal's Ctrl-C reaches the whole process group: the parent decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    directory, flags = argv[0], argv[1:]
    try:
        load_policy_dir(Path(directory), check=deployment_check(tenant_secret="--tenant-secret" in flags))
    except PolicyError as exc:
        sys.stdout.write(str(exc))
        return INVALID
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
