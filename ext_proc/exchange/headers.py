"""The HTTP headers of one message from Envoy, and what the filter reads in them.

Envoy hands a request's (or a reply's) headers over as protobuf; `Headers` is the plain view the
phases read: lower-case names, a repeated header joined with ",", and the route Envoy chose. The
credential helpers say which API keys a request carries, the keys that select its tenant: only
`Authorization: Bearer <key>` and `x-api-key: <key>` are read, and a credential written any other
way (another scheme, other spacing, a key header of another name, a spelling of one of the
filter's own headers) is a `HeaderError`, never a request under the default tenant.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.errors import CordonError
from ext_proc.runtime.bootstrap import FILTER_HEADERS

ROUTE_ATTRIBUTE = "xds.route_name"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
SUBJECT_HEADER = "x-cordon-subject"
TENANT_HEADER = "x-tenant"
MODE_HEADER = "x-redact-mode"
RECEIPT_HEADER = "x-cordon-receipt"
# Never forwarded: the filter's own headers, and accept-encoding so replies arrive readable.
REMOVED_REQUEST_HEADERS = (*FILTER_HEADERS, "accept-encoding")
# Headers that select a tenant, a mode or subjects: a request must send each at most once.
SINGLE_HEADERS = frozenset({"authorization", "x-api-key", SUBJECT_HEADER, TENANT_HEADER, MODE_HEADER})
COMMA_FREE_HEADERS = SINGLE_HEADERS - {SUBJECT_HEADER}
# The credentials the filter reads (each selects a tenant), and `cookie`, which carries state the
# upstream set: random strings, never read for personal data (they could spell a short declared
# identifier by chance) and never rewritten.
KEY_HEADERS = ("authorization", "x-api-key")
CREDENTIAL_HEADERS = frozenset({*KEY_HEADERS, "cookie"})
# Names the filter reads itself, spelled exactly so; a name that folds to one of them (case, `_`
# for `-`) is refused: Envoy forwards `x_cordon_subject` as it is, declared identities and all.
_OWN_NAMES = frozenset({*FILTER_HEADERS, *KEY_HEADERS})
# Other headers that carry a key or a token (`api-key`, `x-goog-api-key`, `openai-api-key`,
# `anthropic-api-key`, `x-auth-token`, `ocp-apim-subscription-key`, `proxy-authorization` …): the
# filter cannot tell which tenant they belong to, so such a request is refused rather than run
# under the default tenant. Matched on the folded name.
_OTHER_KEY_HEADER = regex.compile(
    r"(?:^|-)(?:api-?key|api-?token|auth-?token|access-?token|security-?token|subscription-?key)(?:-|$)"
    r"|authorization$"
)
# `Bearer <key>`: the scheme in any case, one space, the key in visible ASCII.
_BEARER = regex.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] ([\x21-\x7e]+)")
_KEY = regex.compile(r"[\x21-\x7e]+")
_SHOWN_NAME_CHARS = 64


class HeaderError(CordonError):
    """A request header the filter cannot read as it must. The message names the header, never
    its value."""


class CredentialError(HeaderError):
    """A credential the filter cannot read: it cannot tell which tenant's policy applies."""


class LookalikeHeader(HeaderError):
    """A spelling of one of the filter's own header names that is not the name itself."""


@dataclass(frozen=True, slots=True)
class Headers:
    values: dict[str, str]  # a header sent more than once: its values joined with ","
    end_of_stream: bool
    route_name: str
    repeated: frozenset[str] = frozenset()  # the names sent more than once

    @classmethod
    def from_message(cls, message: pb.HttpHeaders, request: pb.ProcessingRequest | None = None) -> Headers:
        values: dict[str, str] = {}
        repeated: set[str] = set()
        for header in message.headers.headers:
            value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
            name = header.key.lower()
            if name in values:
                repeated.add(name)
                values[name] = f"{values[name]},{value}"
            else:
                values[name] = value
        route = ""
        # Envoy 1.40 sends attributes on the ProcessingRequest itself, keyed by the filter's name.
        for source in (request.attributes if request is not None else {}, message.attributes):
            attributes = source.get(EXT_PROC_FILTER)
            if attributes is not None and ROUTE_ATTRIBUTE in attributes.fields:
                route = attributes.fields[ROUTE_ATTRIBUTE].string_value
                break
        return cls(values, message.end_of_stream, route, frozenset(repeated))

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    @property
    def path(self) -> str:
        return self.get(":path") or "/"


def sent_twice(headers: Headers) -> list[str]:
    """The SINGLE_HEADERS a request sent more than once. Envoy joins repeats of some headers
    (`authorization` among them) into one value with ","; a key, a tenant name or a mode never
    holds a comma, so one there is a repeat too."""
    joined = {name for name in COMMA_FREE_HEADERS if "," in (headers.get(name) or "")}
    return sorted((headers.repeated & SINGLE_HEADERS) | joined)


def folded_name(name: str) -> str:
    """A header name as proxies and frameworks may treat it: case and `_`/`-` ignored."""
    return name.lower().replace("_", "-")


def _shown(name: str) -> str:
    return name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS] + "…"


def check_names(headers: Headers) -> None:
    """Raises a `HeaderError` for a look-alike of the filter's own headers or its credentials
    (`x_cordon_subject`, `X_Api_Key`) and for a key header it does not read (`api-key`)."""
    for name in headers.values:
        if name.startswith(":"):
            continue
        folded = folded_name(name)
        if folded in _OWN_NAMES:
            if folded != name:
                raise LookalikeHeader(
                    f"the {_shown(name)} header is not read; write it as {folded} (with hyphens)"
                )
            continue
        if _OTHER_KEY_HEADER.search(folded):
            raise CredentialError(
                f"the {_shown(name)} header carries a credential this proxy does not read; "
                "send the key as 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
            )


def bearer_token(headers: Headers) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None when there is none or it cannot be read."""
    auth = headers.get("authorization")
    match = _BEARER.fullmatch(auth) if auth is not None else None
    return match.group(1) if match is not None else None


def api_keys(headers: Headers) -> list[str]:
    """The credentials a request carries: the bearer token and `x-api-key` (either, both).
    Raises CredentialError when one is there but cannot be read (another scheme than Bearer, a
    tab or two spaces, an empty value, characters outside visible ASCII)."""
    keys = []
    auth = headers.get("authorization")
    if auth is not None:
        token = bearer_token(headers)
        if token is None:
            raise CredentialError(
                "the Authorization header cannot be read: write it as 'Bearer <key>' "
                "(one space, then the key)"
            )
        keys.append(token)
    key = headers.get("x-api-key")
    if key is not None:
        if _KEY.fullmatch(key) is None:
            raise CredentialError("the x-api-key header cannot be read: it must hold the key alone")
        keys.append(key)
    return keys
