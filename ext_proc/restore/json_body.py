"""A non-streamed reply body restored: every string and key of its JSON, in one piece.

Where it sits: a buffered reply (ext_proc.exchange.reply) comes back as one body; with the
output gate on, the gate reads it first as the model wrote it, then this exchange's placeholders
are restored. `restore_tree` is also how an SSE event's other strings are restored
(ext_proc.restore.sse).
"""

from __future__ import annotations

import json
from typing import Any

from ext_proc.restore.output_gate import OutputGate
from ext_proc.restore.restorers import Restorer

# Strings that are JSON text whatever they begin with (tool-call arguments): read as JSON, so an
# original is written for where it lands in it (ext_proc.restore.json_context).
JSON_STRING_KEYS = frozenset({"arguments", "partial_json"})


def compact(data: Any) -> bytes:
    """JSON as the restored body and events are written: compact, UTF-8 as is."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def restore_tree(node: Any, restorer: Restorer) -> tuple[Any, bool]:
    """Restore every string value and object key of a parsed JSON value, in place where possible.

    Returns the (possibly new) value and whether anything changed. Strings under a key in
    `JSON_STRING_KEYS` are JSON text; any other string is JSON text when it begins with `{` or
    `[` (structured output, a JSON document in a string): in JSON text an original is written
    JSON-escaped inside strings, once per string it sits in, and as a JSON value of its own
    outside them. Prose gets the original as it is.
    """
    if isinstance(node, str):
        new = restorer.restore_text(node)
        return new, new is not node and new != node
    if isinstance(node, list):
        changed = False
        for i, item in enumerate(node):
            new_item, item_changed = restore_tree(item, restorer)
            if item_changed:
                node[i] = new_item
                changed = True
        return node, changed
    if isinstance(node, dict):
        changed = keys_changed = False
        pairs: list[tuple[str, Any]] = []
        for key, value in node.items():
            new_key = restorer.restore_text(key)
            if new_key != key:
                keys_changed = True
            if isinstance(value, str) and key in JSON_STRING_KEYS:
                new_value: Any = restorer.restore_text(value, json_escaped=True)
                value_changed = new_value != value
            else:
                new_value, value_changed = restore_tree(value, restorer)
            if value_changed and not keys_changed:
                node[key] = new_value
            changed = changed or value_changed
            pairs.append((new_key, new_value))
        if keys_changed:
            # Rebuilt in place: callers hold references into the tree (the delta they fed).
            node.clear()
            node.update(pairs)
            return node, True
        return node, changed
    return node, False


def restore_json_body(body: bytes, restorer: Restorer, gate: OutputGate | None = None) -> bytes:
    """A non-streamed reply body with this exchange's placeholders restored (and, with `gate`,
    read by the output gate first, as the model wrote it).

    Without the nonce the body comes back as the same bytes. Otherwise it is parsed, restored
    (every string and key; strings that are JSON text, such as tool-call `arguments` or structured
    output, with each original written for where it lands in that JSON) and written back
    compactly. The rule is the same for every dialect: where text and tool calls sit differs
    between them, but every string is restored wherever it sits.
    """
    if gate is None and not restorer.has_any(body):
        return body
    try:
        data = json.loads(body)  # parsed once, for the gate and for restore
        if gate is not None:
            gate.read_tree(data)
        if not restorer.has_any(body):
            return body
        new, changed = restore_tree(data, restorer)
    except (ValueError, RecursionError):
        if gate is not None:
            gate.read(body.decode("utf-8", "replace"))
        if not restorer.has_any(body):
            return body
        # Not JSON (or nested past what the parser takes): restore as text, read as JSON text
        # when it begins like JSON, so every original is written for where it lands.
        text = body.decode("utf-8", "surrogateescape")
        restored = restorer.restore_text(text, json_escaped=text.lstrip()[:1] in ("{", "["))
        return restored.encode("utf-8", "surrogateescape")
    if not changed:
        return body
    return compact(new)
