"""Log lines: JSON with `ts` (RFC 3339, UTC) and `level` first; exceptions by type and place only;
a new run's file starts afresh."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

from ext_proc.runtime.logs import JsonLineFormatter, rotate, timestamp, wrap_line


def record(message: str, level: int = logging.INFO, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("jane.doe@example.com")  # a message that quotes a value
        except ValueError:
            import sys

            info = sys.exc_info()
    return logging.LogRecord("cordon.test", level, __file__, 1, message, None, info)


def parse(line: str) -> dict[str, object]:
    parsed: dict[str, object] = json.loads(line)
    assert list(parsed)[:2] == ["ts", "level"]
    moment = dt.datetime.strptime(str(parsed["ts"]), "%Y-%m-%dT%H:%M:%S.%f%z")
    assert moment.utcoffset() == dt.timedelta(0) and str(parsed["ts"]).endswith("Z")
    return parsed


def test_a_json_message_gains_ts_and_level() -> None:
    line = JsonLineFormatter().format(record('{"event":"exchange","counts":{"EMAIL":1}}', logging.WARNING))
    parsed = parse(line)
    assert parsed["level"] == "warning"
    assert parsed["event"] == "exchange" and parsed["counts"] == {"EMAIL": 1}


def test_any_other_message_is_wrapped() -> None:
    parsed = parse(JsonLineFormatter().format(record("plain text {not json}")))
    assert parsed == {**parsed, "logger": "cordon.test", "message": "plain text {not json}"}
    parsed = parse(JsonLineFormatter().format(record("{}")))
    assert set(parsed) == {"ts", "level"}


def test_an_exception_is_named_never_quoted() -> None:
    line = JsonLineFormatter().format(record('{"event":"crashed"}', logging.CRITICAL, exc=True))
    parsed = parse(line)
    assert parsed["error"] == "ValueError" and str(parsed["where"]).startswith("test_logs.py:")
    assert "jane" not in line and "Traceback" not in line


def test_timestamp_is_utc_with_milliseconds() -> None:
    assert timestamp(0.1234) == "1970-01-01T00:00:00.123Z"


def test_rotate_keeps_one_previous_run(tmp_path: Path) -> None:
    log = tmp_path / "ext_proc.log"
    rotate(log)  # nothing yet: nothing to do
    log.write_text("run 1\n")
    rotate(log)
    assert not log.exists() and (tmp_path / "ext_proc.log.1").read_text() == "run 1\n"
    log.write_text("run 2\n")
    rotate(log)
    assert (tmp_path / "ext_proc.log.1").read_text() == "run 2\n"


def test_a_foreign_line_is_wrapped_and_a_json_line_kept() -> None:
    parsed = parse(wrap_line(b"12:M 01 Jan 2025 Ready to accept connections tcp\n", "redis").decode())
    assert parsed["service"] == "redis" and parsed["message"].startswith("12:M")  # type: ignore[union-attr]
    kept = b'{"ts":"2025-01-01T00:00:00.000Z","level":"info","event":"x"}\n'
    assert wrap_line(kept, "x") == kept
