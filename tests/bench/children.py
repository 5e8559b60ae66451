"""The bench's servers in processes of their own (their own core and GIL): the fake upstream and
the floors' pass-through ext_proc. Each prints its port, serves until its stdin closes, and may
print a last line (the floor's stream counts) on its way out."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Child:
    port: int
    pid: int
    output: str = ""  # what it printed after its port, once it has stopped


@contextlib.contextmanager
def port_child(arguments: list[str], name: str) -> Iterator[Child]:
    """`python ARGUMENTS` from the project's root; yields its port and pid, then stops it."""
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root
    )
    assert process.stdin is not None and process.stdout is not None
    child = Child(0, process.pid)
    try:
        line = process.stdout.readline().strip()
        if not line.isdigit():
            raise SystemExit(f"bench: {name} did not start")
        child.port = int(line)
        yield child
    finally:
        try:
            child.output, _ = process.communicate(timeout=10)  # closes its stdin: the server stops
        except subprocess.TimeoutExpired:
            process.terminate()
            process.wait(5)
