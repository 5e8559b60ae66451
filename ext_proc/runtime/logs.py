"""Log lines: one JSON object per line, each starting with `ts` (RFC 3339, UTC) and `level`.

Cordon's own messages are JSON objects already (`{"event": …}`); the formatter puts `ts` and
`level` in front of their fields. Any other message (a library's) becomes
`{"ts", "level", "logger", "message"}`. An exception is written as its type and the place it was
raised, never its message or a traceback's text: either can quote a request's body.

`rotate` starts a log file afresh for a new run: the previous run's file becomes `NAME.1` (one
generation kept), so a file never mixes two runs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from types import TracebackType

LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def timestamp(created: float) -> str:
    """RFC 3339 in UTC with milliseconds: 2025-01-31T12:00:00.123Z."""
    moment = dt.datetime.fromtimestamp(created, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        head = f'{{"ts":"{timestamp(record.created)}","level":"{record.levelname.lower()}"'
        message = record.getMessage()
        fields = _fields(message)
        if fields is None:
            body = f',"logger":{json.dumps(record.name)},"message":{json.dumps(message)}'
        else:
            body = fields
        if record.exc_info and record.exc_info[0] is not None:
            body += "," + _exception(record.exc_info[0], record.exc_info[2])[1:-1]
        return head + body + "}"


def _fields(message: str) -> str | None:
    """`,"key":value…` of a message that is a JSON object, or None for any other message."""
    text = message.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    parsed.pop("ts", None)
    parsed.pop("level", None)
    inner = json.dumps(parsed, separators=(",", ":"))[1:-1]
    return "," + inner if inner else ""


def _exception(kind: type[BaseException], tb: TracebackType | None) -> str:
    where = None
    if tb is not None:
        frame = traceback.extract_tb(tb)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
    return json.dumps({"error": kind.__name__, "where": where}, separators=(",", ":"))


def setup(level_name: str | None = None) -> None:
    """JSON lines on standard error for every logger; uncaught exceptions logged the same way."""
    level = (level_name or os.environ.get("LOG_LEVEL", "INFO")).upper()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if level in LEVELS else "INFO")

    def uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            return
        logging.getLogger("cordon").critical('{"event":"crashed"}', exc_info=(kind, value, tb))

    sys.excepthook = uncaught


def rotate(path: Path) -> None:
    """Keep the previous run's `path` as `path.1` (replacing an older one); start afresh."""
    if path.exists() and path.stat().st_size > 0:
        path.replace(path.with_name(path.name + ".1"))


def wrap_line(raw: bytes, service: str) -> bytes:
    """A line of a service that does not write JSON itself (the embedded Redis, the fake
    upstream), as a JSON line with `ts` and `level`; a JSON line with both is kept as it is."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    if text.startswith("{") and '"ts"' in text and '"level"' in text:
        return (text + "\n").encode()
    now = dt.datetime.now(dt.UTC).timestamp()
    line = {"ts": timestamp(now), "level": "info", "service": service, "message": text}
    return (json.dumps(line, separators=(",", ":")) + "\n").encode()
