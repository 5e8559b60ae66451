"""The HTTP headers of one message from Envoy, and what the filter reads in them.

Envoy hands a request's (or a reply's) headers over as protobuf; `Headers` is the plain view the
phases read: lower-case names, a repeated header joined with ",", and the route Envoy chose. The
credential helpers say which API keys a request carries, the keys that select its tenant.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

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
# Headers a subject request's identifiers are not looked for in: credentials (random strings that
# could spell a short id by chance), the subject header itself (removed) and framing.
UNREAD_HEADERS = frozenset({"authorization", "x-api-key", SUBJECT_HEADER, "content-length", "content-type"})


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


def bearer_token(headers: Headers) -> str | None:
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


def api_keys(headers: Headers) -> list[str]:
    """The credentials a request carries: the bearer token and `x-api-key` (either, both)."""
    keys = [bearer_token(headers), (headers.get("x-api-key") or "").strip() or None]
    return [key for key in keys if key]
