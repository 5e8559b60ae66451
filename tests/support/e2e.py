"""Helpers for end-to-end tests: invented values, raw HTTP, and leak checks on what arrived upstream."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.harness import RunningStack

# Invented values of each catalog kind (reserved domains, test card numbers, documentation keys).
SAMPLES: dict[str, str] = {
    "EMAIL": "jane.roe@example.com",
    "CREDIT_CARD": "4111 1111 1111 1111",
    "PHONE": "+1 212-555-0143",
    "SSN": "123-45-6789",
    "IBAN": "DE89 3704 0044 0532 0130 00",
    "IP": "198.51.100.23",  # a documentation address: redacted unless the policy skips them
    "AWS_ACCESS_KEY": "AKIAZ3MHQ4EXAMPLE7QK",
    "GITHUB_TOKEN": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "OPENAI_KEY": "sk-proj-" + "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LzXcVbNm",
}

# An invented person declared in X-Cordon-Subject by the subject tests (every field kind).
PERSON: dict[str, list[str]] = {
    "names": ["Marisol Quintero-Vance"],
    "emails": ["mq@example.com"],
    "phones": ["+1 404-555-0187"],
    "addresses": ["1428 Elm Street Apt 4, Atlanta"],
    "dates": ["1986-07-14"],
    "ids": ["A1234567"],
    "handles": ["mqvance77"],
    "other": ["Project Bluebird"],
}

SENTENCE = (
    f"Mail {SAMPLES['EMAIL']} or call {SAMPLES['PHONE']}; card {SAMPLES['CREDIT_CARD']}, "
    f"SSN {SAMPLES['SSN']}, IBAN {SAMPLES['IBAN']}, host {SAMPLES['IP']}, "
    f"keys {SAMPLES['AWS_ACCESS_KEY']} {SAMPLES['GITHUB_TOKEN']} {SAMPLES['OPENAI_KEY']}."
)


def leaked(data: bytes | str) -> list[str]:
    """The kinds whose sample value appears in `data`, raw or JSON-escaped (never the values)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    found = []
    for kind, value in SAMPLES.items():
        escaped = json.dumps(value)[1:-1]
        if value in text or escaped in text or json.dumps(escaped)[1:-1] in text:
            found.append(kind)
    return found


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | str | dict[str, Any] | None = None,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    *,
    timeout: float = 15.0,
) -> Reply:
    """Raw HTTP/1.1 with the path sent exactly as given (no client-side normalisation). `headers`
    as a list of pairs may name a header more than once; a `host` among them replaces the
    client's own."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8")
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    names = {name.lower() for name, _ in pairs}
    if "content-type" not in names:
        pairs.insert(0, ("content-type", "application/json"))
    if not names & {"content-length", "transfer-encoding"} and (body is not None or method == "POST"):
        pairs.append(("content-length", str(len(body or b""))))
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.putrequest(
            method, path, skip_host="host" in names, skip_accept_encoding="accept-encoding" in names
        )
        for name, value in pairs:
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def chat_body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **extra}


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Polls `predicate` until it holds; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def log_events(stack: RunningStack, event: str) -> list[dict[str, Any]]:
    """The ext_proc log's JSON records of one `event`."""
    text = (stack.settings.run_dir / "logs" / "ext_proc.log").read_text(errors="replace")
    records = (json.loads(line) for line in text.splitlines() if line.startswith("{"))
    return [record for record in records if record.get("event") == event]


def metric(stack: RunningStack, series: str) -> float:
    """One series' value from the stack's Prometheus endpoint (0 when absent)."""
    url = f"http://127.0.0.1:{stack.settings.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(series + " "))


def last_sent(stack: RunningStack) -> str:
    """The body of the last request the stack's fake upstream received."""
    return stack.upstream.received[-1].text()
