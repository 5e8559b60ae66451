"""The processes that do no exchange work stay small: what `serve`'s supervisor and `stack run`
import (their modules, the command line, the settings with a REDIS_URL) holds none of the worker's
libraries or the detectors. Each is checked in a fresh interpreter, as the process starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Top-level packages a worker needs and a supervisor must not load (grpcio and protobuf, Redis, the
# catalog's regex engine, YAML, phone metadata, dates, images, cryptography's native module).
HEAVY = ("grpc", "envoy", "redis", "regex", "yaml", "phonenumbers", "dateutil", "PIL")
HEAVY_MODULES = (
    "cryptography.hazmat.bindings._rust",
    "ext_proc.detect.catalog.engine",
    "ext_proc.policy.load",
    "ext_proc.policy.model",
    "ext_proc.exchange.exchange",
    "ext_proc.dialects",
    "ext_proc.service.worker",
)

PROBE = """
import json, sys
from ext_proc.__main__ import build_parser
from ext_proc.runtime.config import Settings
build_parser()
Settings.from_env()
for name in sys.argv[1:]:
    __import__(name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded(*modules: str) -> set[str]:
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:6390/0", "RUN_DIR": "/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize(
    "modules",
    [
        ("ext_proc.service.supervisor", "ext_proc.audit.metrics"),
        ("ext_proc.runtime.stack",),
        ("ext_proc.policy.precheck", "ext_proc.runtime.envoy_config"),  # what the parents import
    ],
)
def test_the_supervisors_import_none_of_the_workers_libraries(modules: tuple[str, ...]) -> None:
    names = loaded(*modules)
    assert not [n for n in names if n.split(".")[0] in HEAVY or n.startswith(("google.protobuf",))]
    assert not [n for n in HEAVY_MODULES if n in names]


def test_a_worker_without_tenant_secret_does_not_load_the_vaults_cipher() -> None:
    """cryptography's native module is loaded when a vault is made (TENANT_SECRET set), not on import."""
    names = loaded("ext_proc.service.worker")
    assert "ext_proc.storage.vault" in names
    assert "cryptography.hazmat.bindings._rust" not in names
