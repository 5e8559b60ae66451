"""Policy reloads never half-apply: a file being written is not read until it has settled."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ext_proc.policy.model import hash_api_key
from tests.support.e2e import chat_body, request, wait_for
from tests.support.harness import KEYS, running_stack
from tests.support.receipts import record_for

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"


def test_a_file_written_in_pieces_never_applies_half_written(tmp_path: Path) -> None:
    """A strict tenant's file is rewritten every 100 ms in two pieces (the first alone is a valid,
    looser policy: no requireSubject, no strip). Requests keep coming meanwhile: every one of them
    runs under the last good version (400 `subject_required`). A version written whole by a
    rename is taken once it settles."""
    digest = hash_api_key(KEYS["require"])
    head = f'tenant: require\napiKeys: ["sha256:{digest}"]\n'
    strict = "requireSubject: true\nmode: strip\noutputGate: deny\n"
    with running_stack(tmp_path, workers=1) as stack:
        policy = tmp_path / "policies" / "require.yaml"
        policy.write_text(head + strict)
        port = stack.settings.listen_port
        auth = {"authorization": f"Bearer {KEYS['require']}"}
        wait_for(lambda: request(port, "POST", CHAT, chat_body("hi"), auth).status == 400)
        stop = threading.Event()

        def writer() -> None:
            while not stop.is_set():
                with policy.open("w") as out:
                    out.write(head)
                    out.flush()
                    time.sleep(0.03)
                    out.write(strict)
                time.sleep(0.07)

        thread = threading.Thread(target=writer)
        thread.start()
        statuses: list[int] = []
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                statuses.append(request(port, "POST", CHAT, chat_body("hi"), auth).status)
        finally:
            stop.set()
            thread.join()
        assert len(statuses) > 50
        assert set(statuses) == {400}, f"{sum(s != 400 for s in statuses)} of {len(statuses)} ran looser"
        # Written whole (a temporary file renamed over it): taken once it has settled.
        staged = policy.with_name(".require.yaml.new")
        staged.write_text(head + "mode: strip\n")
        staged.replace(policy)

        def strip_without_subject() -> bool:
            reply = request(port, "POST", CHAT, chat_body("hi"), auth)
            return (
                reply.status == 200
                and record_for(stack, "require", reply.headers["x-cordon-receipt"])["mode"] == "strip"
            )

        wait_for(strip_without_subject)
