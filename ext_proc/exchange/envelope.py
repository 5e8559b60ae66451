"""What leaves outside the body: a request's header values and query string, read and rewritten.

Called by exchange.admission once a request's tenant, route and subjects are known. Every header
value that is neither a credential nor framing, and every name and value of the query string
(percent-decoded), is read like a string of the body: by the tenant's catalog and the declared
subjects, with the header's name (or the parameter's) before it as context. What they find is
replaced the same way, a placeholder or a strip marker: a header through Envoy's header mutation,
the query through `:path`; a header whose name holds a value is dropped. Nothing restores these
in a reply. The egress check then reads what would leave: the path and every header's name and
value, pseudo-headers (`:authority`) and framing included; only the credentials, the headers the
filter removes and `content-length` are left out. docs/http-api.md is the user's account of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from urllib.parse import quote, unquote_plus

from ext_proc.detect.catalog.extensions import compiled
from ext_proc.detect.findings import Finding
from ext_proc.detect.memo import TextMemo
from ext_proc.detect.subjects.matcher import CompiledSubjects, is_hex_id
from ext_proc.exchange.context import RequestContext
from ext_proc.exchange.headers import CREDENTIAL_HEADERS, REMOVED_REQUEST_HEADERS, Headers
from ext_proc.transform.actions import apply_actions
from ext_proc.transform.egress import neutralise_own_markers
from ext_proc.transform.grammar import may_hold_pseudonym, pseudonym_pattern
from ext_proc.transform.redact import Replacement, resolve_overlaps, reversible, rewrite, strip
from ext_proc.transform.surrogates import surrogates_kept

# Never read: credentials (random strings that could spell a short identifier by chance; the key
# headers are checked by exchange.headers) and what the filter removes before forwarding.
UNREAD_HEADERS = frozenset({*CREDENTIAL_HEADERS, *REMOVED_REQUEST_HEADERS})
# Read by the egress check, never rewritten: the request line and framing (rewriting them would
# change where and how the request goes; `:path` is rewritten in its query only).
FRAMING_HEADERS = frozenset(
    {
        ":method",
        ":scheme",
        ":authority",
        ":path",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "te",
        "upgrade",
        "keep-alive",
        "proxy-connection",
        "expect",
    }
)
# Headers whose value is an identifier of the protocol (an organisation or project, a version, an
# idempotency or trace id, an SDK's own): a random-looking id there is no secret, and rewriting it
# breaks the request, so HIGH_ENTROPY and SECRET_ASSIGNMENT are not applied to them. Every other
# kind is (an email in `openai-organization` is still an email).
PROTOCOL_HEADERS = frozenset(
    {
        "openai-organization",
        "openai-project",
        "openai-beta",
        "anthropic-version",
        "anthropic-beta",
        "idempotency-key",
        "x-request-id",
        "traceparent",
        "tracestate",
    }
)
PROTOCOL_PREFIXES = ("x-stainless-",)
_ID_LIKE_KINDS = frozenset({"HIGH_ENTROPY", "SECRET_ASSIGNMENT"})
PATH = ":path"
# Header texts are short, below the shared memo's threshold, and repeat from request to request.
HEADER_MEMO = TextMemo(max_weight=2048, min_length=0)

Find = Callable[[str, str], list[Finding]]  # (header name, text) → findings


@dataclass(frozen=True, slots=True)
class Envelope:
    """A request's headers as they would leave."""

    set_headers: tuple[tuple[str, str], ...]  # the rewritten ones (`:path` when its query changed)
    values: Mapping[str, str]  # every header's value as it would leave
    removed: tuple[str, ...] = ()  # headers whose name holds a finding (a name takes no placeholder)

    @property
    def path_rewritten(self) -> bool:
        return any(name == PATH for name, _ in self.set_headers)


def _is_protocol(name: str) -> bool:
    return name in PROTOCOL_HEADERS or name.startswith(PROTOCOL_PREFIXES)


def finder(context: RequestContext, counts: Counter[str]) -> Find:
    """The detectors a body string meets (the tenant's catalog and the declared subjects), for a
    header or query text; the policy's actions applied as in the body (`counts` gains the kinds
    passed through under `allow`)."""
    policy = context.policy
    catalog = context.catalog()
    subjects = context.subjects
    surrogate = policy.mode == "surrogate"
    scope = _memo_scope(context)

    def detect(protocol: bool, text: str) -> tuple[Finding, ...]:
        found: Callable[[str], list[Finding]] = catalog.detect
        findings = (surrogates_kept(found) if surrogate else found)(text)
        if findings and protocol:
            findings = [f for f in findings if f.kind not in _ID_LIKE_KINDS]
        if findings and may_hold_pseudonym(text):
            # A consistent pseudonym this proxy wrote carries no value: its digest is no secret.
            spans = [m.span() for m in pseudonym_pattern().finditer(text)]
            findings = [f for f in findings if not any(a <= f.start and f.end <= b for a, b in spans)]
        if subjects is not None:
            findings = [*findings, *subjects.detect(text)]
        return tuple(findings)

    def find(name: str, text: str) -> list[Finding]:
        protocol = _is_protocol(name)
        # Most header values come again with every request of a client (its SDK's): remembered.
        # Actions are applied per request, after the memo: an allowed kind is counted each time.
        return apply_actions(
            list(HEADER_MEMO(("headers", scope, protocol), text, partial(detect, protocol))),
            policy.extensions,
            counts,
        )

    return find


def _memo_scope(context: RequestContext) -> tuple[Hashable, ...]:
    """What a header's findings depend on besides its text: the detectors the request meets."""
    policy, subjects = context.policy, context.subjects
    return (
        policy.sets,
        policy.skip_documentation_ips,
        policy.mode == "surrogate",
        subjects.digest if subjects is not None else None,
        compiled(policy.extensions).digest,  # two tenants' catalogs of the same sets differ
    )


def rewritten(context: RequestContext, headers: Headers, counts: Counter[str]) -> Envelope:
    """The headers with every finding in a readable value, and in the query, replaced; `counts`
    gains one per replaced finding, by label. Raises DetectionError when a detector cannot finish.

    A client sends the same headers with every request (its SDK's, its keys): a set of names,
    values and query read before and found clean is answered from the memo with one lookup.
    """
    read = [(name, value) for name, value in headers.values.items() if _is_read(name)]
    query = headers.path.partition("?")[2]
    if not read and not query:
        return Envelope((), dict(headers.values))
    scope = ("clean headers", _memo_scope(context))
    # Each part is length-prefixed: two different sets never spell the same key.
    key = "".join(f"{len(n)}:{n}{len(v)}:{v}" for n, v in read) + f"{len(query)}:{query}"
    done: list[Envelope] = []

    def read_all(_: str) -> bool:
        found: Counter[str] = Counter()
        envelope = _rewritten(context, headers, found)
        counts.update(found)
        done.append(envelope)
        return not (envelope.set_headers or envelope.removed or found)

    clean = HEADER_MEMO(scope, key, read_all)
    if not done and not clean:
        read_all(key)  # known to hold findings: read again, the rewrite is this request's own
    return done[0] if done else Envelope((), dict(headers.values))


def _is_read(name: str) -> bool:
    """A header the rewrite reads: neither a credential, nor removed, nor framing."""
    return not (name in UNREAD_HEADERS or name in FRAMING_HEADERS or name.startswith(":"))


def _rewritten(context: RequestContext, headers: Headers, counts: Counter[str]) -> Envelope:
    find = finder(context, counts)
    replacement: Replacement = reversible(context.placeholders) if context.restores else strip
    values = dict(headers.values)
    changed: list[tuple[str, str]] = []
    removed: list[str] = []
    for name, value in headers.values.items():
        if not _is_read(name):
            continue
        in_name = resolve_overlaps(find(name, name))
        if in_name:
            # `<` and `[` cannot be part of a header name: one holding a value is dropped whole.
            counts.update(finding.label for finding in in_name)
            removed.append(name)
            del values[name]
            continue
        if not value:
            continue
        new = _rewrite_after(f"{name}: ", value, partial(find, name), replacement, counts)
        if new != value:
            values[name] = new
            changed.append((name, new))
    path = headers.path
    new_path = _rewrite_query(path, partial(find, PATH), replacement, counts)
    if new_path != path:
        values[PATH] = new_path
        changed.append((PATH, new_path))
    return Envelope(tuple(changed), values, tuple(removed))


def _rewrite_after(
    context: str,
    text: str,
    find: Callable[[str], list[Finding]],
    replacement: Replacement,
    counts: Counter[str],
) -> str:
    """`text` with its findings replaced, read after `context` (a header's name, a parameter's):
    a finding that begins in the context is cut to the part in `text`."""
    cut = len(context)
    findings = []
    for finding in resolve_overlaps(find(context + text)):
        if finding.end <= cut:
            continue
        findings.append(replace(finding, start=max(finding.start, cut) - cut, end=finding.end - cut))
    if not findings:
        return text
    return rewrite(text, findings, replacement, counts)


def _rewrite_query(
    path: str, find: Callable[[str], list[Finding]], replacement: Replacement, counts: Counter[str]
) -> str:
    """The path with each name and value of its query read percent-decoded, and written back
    percent-encoded where something was replaced; every other byte stays as it was sent."""
    head, mark, query = path.partition("?")
    if not mark or not query:
        return path
    pairs = []
    for pair in query.split("&"):
        raw_name, equals, raw_value = pair.partition("=")
        name = unquote_plus(raw_name)
        new_name = _rewrite_after("", name, find, replacement, counts) if name else name
        out = raw_name if new_name == name else quote(new_name, safe="")
        if equals:
            value = unquote_plus(raw_value)
            new_value = _rewrite_after(name + "=", value, find, replacement, counts) if value else value
            out += "=" + (raw_value if new_value == value else quote(new_value, safe=""))
        pairs.append(out)
    return f"{head}?{'&'.join(pairs)}"


# --- the egress check -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Survivor:
    label: str  # e.g. SUBJECT1_EMAIL: a kind and a position, never the value
    where: str  # "in the request path" | "in a request header"


def survivor(subjects: CompiledSubjects, envelope: Envelope, nonce: str) -> Survivor | None:
    """The first declared identifier still readable in what would leave outside the body."""

    def read(text: str) -> str | None:
        if "<" in text or "[" in text:
            text = neutralise_own_markers(text, nonce)
        return HEADER_MEMO(("survivor", subjects.digest), text, subjects.first_survivor)

    path = envelope.values.get(PATH) or "/"
    # A rewritten query holds this request's placeholders percent-encoded: it is read decoded, so
    # that they are recognised (the matcher decodes once more, for anything encoded twice).
    label = read(unquote_plus(path)) if envelope.path_rewritten else subjects.first_survivor(path)
    if label is not None:
        return Survivor(label, "in the request path")
    for name, value in envelope.values.items():
        # content-length is the body's length, which the body's own check reads.
        if name in (PATH, "content-length") or name in REMOVED_REQUEST_HEADERS:
            continue
        if name in CREDENTIAL_HEADERS:
            # Keys and cookies are random and never rewritten: read for long forms only (a
            # whole name, an email, a number), so that chance never refuses a key.
            label = subjects.first_survivor(value, long_only=True)
            if label is not None:
                return Survivor(label, "in a request header")
            continue
        # The name and the value together (an identifier may run across them); apart when the
        # value is one hex identifier (a request or trace id), which is read alone, with long keys.
        texts = (name, value) if is_hex_id(value) else (f"{name} {value}",)
        for text in texts:
            label = read(text)
            if label is not None:
                return Survivor(label, "in a request header")
    return None
