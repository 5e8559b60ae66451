"""Render a Helm chart without Helm: the subset of Go templates envoy/helm/cordon/ is written in.

`helm` is not a pip package, so the tests render the chart with this module and, where a `helm`
binary is on PATH, compare it with `helm template`. It is strict where Helm is lenient: anything
outside the subset below is an error rather than a guess, so a template that renders here means
the same under Helm.

The subset:
  text and actions `{{ ... }}`, with `{{-` / `-}}` trimming whitespace; comments `{{/* ... */}}`
  `define "name"` / `include "name" ARG`; `if` / `else if` / `else` / `end`; `range PIPE`,
  `range $v := PIPE`, `range $k, $v := PIPE`; `$`, `$var.field`, `.field.field`, "strings", ints,
  true/false, (sub pipelines), `|` pipes
  functions: quote, toYaml, nindent, indent, default, required, fail, not, and, or, eq, ne, dict, empty,
  int, add, until

Helm reads every number in values as a float64 and prints 33554432 as 3.3554432e+07; this
renderer refuses to print an int of 1e6 or more for that reason (write such values as strings).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    pass


# --- lexing --------------------------------------------------------------------------------------

ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<int>-?\d+)
    | (?P<assign>:=)
    | (?P<punct>[|(),])
    | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)


def tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise TemplateError(f"cannot read {text[pos:]!r}")
        kind = match.lastgroup
        assert kind is not None
        out.append((kind, match.group(kind)))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


# --- parsing -------------------------------------------------------------------------------------


@dataclass
class Text:
    text: str


@dataclass
class Action:
    pipe: list[list[tuple[str, Any]]]  # commands, each a list of operands
    assign: str | None = None


@dataclass
class If:
    branches: list[tuple[Action, list[Any]]]
    otherwise: list[Any] = field(default_factory=list)


@dataclass
class Range:
    names: list[str]
    pipe: Action
    body: list[Any]
    otherwise: list[Any] = field(default_factory=list)


def parse_pipe(toks: list[tuple[str, str]]) -> Action:
    assign = None
    names: list[str] = []
    if len(toks) >= 2 and toks[0][0] == "var" and toks[1][0] == "assign":
        assign, toks = toks[0][1], toks[2:]
    elif len(toks) >= 4 and toks[0][0] == "var" and toks[1] == ("punct", ",") and toks[3][0] == "assign":
        names, toks = [toks[0][1], toks[2][1]], toks[4:]
    action = Action(_commands(toks), assign)
    if names:
        action.assign = ",".join(names)
    return action


def _commands(toks: list[tuple[str, str]]) -> list[list[tuple[str, Any]]]:
    commands: list[list[tuple[str, Any]]] = [[]]
    i = 0
    while i < len(toks):
        kind, value = toks[i]
        if (kind, value) == ("punct", "|"):
            commands.append([])
        elif (kind, value) == ("punct", "("):
            depth, j = 1, i + 1
            while depth:
                if j >= len(toks):
                    raise TemplateError("unbalanced parenthesis")
                depth += {"(": 1, ")": -1}.get(toks[j][1], 0) if toks[j][0] == "punct" else 0
                j += 1
            commands[-1].append(("sub", _commands(toks[i + 1 : j - 1])))
            i = j
            continue
        elif kind in ("punct", "assign"):
            raise TemplateError(f"unexpected {value!r}")
        else:
            commands[-1].append((kind, value))
        i += 1
    if not all(commands):
        raise TemplateError("empty command in a pipeline")
    return commands


def parse(source: str, defines: dict[str, list[Any]]) -> list[Any]:
    """The template's nodes; `define` blocks go into `defines`."""
    nodes: list[Any] = []
    stack: list[tuple[str, Any, list[Any]]] = []  # (keyword, node, the list being filled)
    current = nodes
    pos = 0
    trim_next = False
    for match in ACTION.finditer(source):
        text = source[pos : match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        if text:
            current.append(Text(text))
        pos = match.end()
        trim_next = bool(match.group(3))
        body = match.group(2).strip()
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError("unterminated comment")
            continue
        toks = tokens(body)
        head = toks[0][1] if toks and toks[0][0] == "ident" else None
        if head == "define":
            name = json.loads(toks[1][1])
            block: list[Any] = []
            stack.append(("define", name, current))
            current = block
            defines[name] = block
        elif head == "if":
            node = If([(parse_pipe(toks[1:]), [])])
            current.append(node)
            stack.append(("if", node, current))
            current = node.branches[0][1]
        elif head == "range":
            names: list[str] = []
            rest = toks[1:]
            if len(rest) >= 2 and rest[1][0] == "assign":
                names, rest = [rest[0][1]], rest[2:]
            elif len(rest) >= 4 and rest[1] == ("punct", ",") and rest[3][0] == "assign":
                names, rest = [rest[0][1], rest[2][1]], rest[4:]
            node = Range(names, Action(_commands(rest)), [])
            current.append(node)
            stack.append(("range", node, current))
            current = node.body
        elif head == "else":
            if not stack or stack[-1][0] not in ("if", "range"):
                raise TemplateError("else outside if/range")
            keyword, node, _ = stack[-1]
            if keyword == "if" and len(toks) > 1 and toks[1] == ("ident", "if"):
                node.branches.append((parse_pipe(toks[2:]), []))
                current = node.branches[-1][1]
            else:
                current = node.otherwise
        elif head == "end":
            if not stack:
                raise TemplateError("end without a block")
            keyword, node, parent = stack.pop()
            current = parent
        elif head in ("with", "template", "block", "break", "continue"):
            raise TemplateError(f"{head} is outside the subset")
        else:
            current.append(parse_pipe(toks))
    text = source[pos:]
    if trim_next:
        text = text.lstrip()
    if text:
        current.append(Text(text))
    if stack:
        raise TemplateError(f"unclosed {stack[-1][0]}")
    return nodes


# --- evaluation ----------------------------------------------------------------------------------


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (isinstance(value, (dict, list)) and not value)


def to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True, width=10**9).rstrip("\n")


def printed(value: Any) -> str:
    if value is None:
        return ""  # Helm prints <no value>, then removes it
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) >= 10**6:
            raise TemplateError(f"{value}: Helm would print this number as a float; make it a string")
        return str(value)
    if isinstance(value, float):
        raise TemplateError(f"{value}: a float")
    if isinstance(value, str):
        return value
    raise TemplateError(f"cannot print a {type(value).__name__}; use toYaml")


def _quote(value: Any) -> str:
    text = printed(value)
    if not text.isascii():
        raise TemplateError("quote of a non-ASCII string")
    return json.dumps(text)


def _indent(width: int, text: Any) -> str:
    pad = " " * width
    return "\n".join(pad + line for line in printed(text).split("\n"))


def _required(message: str, value: Any) -> Any:
    if value is None or value == "":
        raise TemplateError(message)
    return value


def _fail(message: str) -> None:
    raise TemplateError(message)


def _and(*values: Any) -> Any:
    for value in values:
        if not truthy(value):
            return value
    return values[-1]


def _or(*values: Any) -> Any:
    for value in values:
        if truthy(value):
            return value
    return values[-1]


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TemplateError(f"int of a {type(value).__name__}")
    return int(value)


def _until(count: Any) -> list[int]:
    # Sprig's until takes an int: Helm's values are float64, so the chart writes `until (int X)`.
    if isinstance(count, bool) or not isinstance(count, int):
        raise TemplateError(f"until of a {type(count).__name__}")
    return list(range(count))


def _dict(*pairs: Any) -> dict[str, Any]:
    if len(pairs) % 2:
        raise TemplateError("dict takes key/value pairs")
    return {str(pairs[i]): pairs[i + 1] for i in range(0, len(pairs), 2)}


class Renderer:
    def __init__(self, defines: dict[str, list[Any]]) -> None:
        self.defines = defines
        self.functions: dict[str, Callable[..., Any]] = {
            "quote": _quote,
            "toYaml": to_yaml,
            "nindent": lambda n, s: "\n" + _indent(n, s),
            "indent": _indent,
            "default": lambda d, v=None: v if truthy(v) else d,
            "required": _required,
            "not": lambda v: not truthy(v),
            "and": _and,
            "or": _or,
            "eq": lambda a, b: a == b and type(a) is type(b),
            "ne": lambda a, b: not (a == b and type(a) is type(b)),
            "dict": _dict,
            "empty": lambda v: not truthy(v),
            "include": self.include,
            "fail": _fail,
            "int": _int,
            "add": lambda *values: sum(_int(v) for v in values),
            "until": _until,
        }

    def include(self, name: str, dot: Any) -> str:
        if name not in self.defines:
            raise TemplateError(f"no template {name!r}")
        return self.nodes(self.defines[name], dot, {"$": dot})

    def nodes(self, nodes: list[Any], dot: Any, env: dict[str, Any]) -> str:
        out: list[str] = []
        for node in nodes:
            if isinstance(node, Text):
                out.append(node.text)
            elif isinstance(node, Action):
                value = self.pipe(node.pipe, dot, env)
                if node.assign:
                    env[node.assign] = value
                else:
                    out.append(printed(value))
            elif isinstance(node, If):
                for condition, body in node.branches:
                    if truthy(self.pipe(condition.pipe, dot, env)):
                        out.append(self.nodes(body, dot, dict(env)))
                        break
                else:
                    out.append(self.nodes(node.otherwise, dot, dict(env)))
            elif isinstance(node, Range):
                items = self.pipe(node.pipe.pipe, dot, env)
                pairs = sorted(items.items()) if isinstance(items, dict) else list(enumerate(items or []))
                if not pairs:
                    out.append(self.nodes(node.otherwise, dot, dict(env)))
                for key, value in pairs:
                    scope = dict(env)
                    if len(node.names) == 1:
                        scope[node.names[0]] = value
                    elif len(node.names) == 2:
                        scope[node.names[0]], scope[node.names[1]] = key, value
                    out.append(self.nodes(node.body, value, scope))
        return "".join(out)

    def pipe(self, commands: list[list[tuple[str, Any]]], dot: Any, env: dict[str, Any]) -> Any:
        value: Any = _NOTHING
        for command in commands:
            value = self.command(command, dot, env, value)
        return value

    def command(self, command: list[tuple[str, Any]], dot: Any, env: dict[str, Any], piped: Any) -> Any:
        kind, head = command[0]
        if kind == "ident" and head not in ("true", "false", "nil"):
            if head not in self.functions:
                raise TemplateError(f"function {head!r} is outside the subset")
            args = [self.operand(op, dot, env) for op in command[1:]]
            if piped is not _NOTHING:
                args.append(piped)
            try:
                return self.functions[head](*args)
            except TypeError as exc:
                raise TemplateError(f"{head}: {exc}") from None
        if len(command) != 1 or piped is not _NOTHING:
            raise TemplateError(f"{head!r} is not a function")
        return self.operand(command[0], dot, env)

    def operand(self, op: tuple[str, Any], dot: Any, env: dict[str, Any]) -> Any:
        kind, value = op
        if kind == "str":
            return json.loads(value)
        if kind == "int":
            return int(value)
        if kind == "ident":
            return {"true": True, "false": False, "nil": None}[value]
        if kind == "sub":
            return self.pipe(value, dot, env)
        if kind == "field":
            return walk(dot, value.split(".")[1:] if value != "." else [])
        if kind == "var":
            name, *path = value.split(".")
            if name not in env:
                raise TemplateError(f"undefined variable {name}")
            return walk(env[name], path)
        raise TemplateError(f"unexpected {value!r}")


_NOTHING = object()


def walk(value: Any, path: list[str]) -> Any:
    for i, key in enumerate(path):
        if value is None:
            raise TemplateError(f"nil pointer evaluating .{'.'.join(path[: i + 1])}")
        if not isinstance(value, Mapping):
            raise TemplateError(f"cannot read .{key} of a {type(value).__name__}")
        value = value.get(key)
    return value


# --- the chart -----------------------------------------------------------------------------------


def merge(base: Any, override: Any) -> Any:
    """Helm's coalescing of values: maps merge key by key, anything else replaces, null deletes."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return copy.deepcopy(override)
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge(merged.get(key), value)
    return merged


def render_chart(
    chart: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "cordon",
    namespace: str = "cordon",
) -> dict[str, str]:
    """Every template of `chart` (templates/*.yaml, helpers from templates/_*.tpl) rendered as
    `helm template` would: file name -> text."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    root = {
        "Values": merge(defaults, dict(values or {})),
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
        "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta.get("appVersion")},
    }
    defines: dict[str, list[Any]] = {}
    for helper in sorted((chart / "templates").glob("_*.tpl")):
        parse(helper.read_text(), defines)
    parsed = {
        path.name: parse(path.read_text(), defines) for path in sorted((chart / "templates").glob("*.yaml"))
    }
    renderer = Renderer(defines)
    return {name: renderer.nodes(nodes, root, {"$": root}) for name, nodes in parsed.items()}


def manifests(rendered: Mapping[str, str]) -> list[dict[str, Any]]:
    """The objects of a rendering, in file order (empty documents dropped)."""
    return [doc for name in sorted(rendered) for doc in yaml.safe_load_all(rendered[name]) if doc is not None]
