"""The admin API (`/admin/*` on Envoy's listener, answered here, never forwarded).

Closed (404) while `ADMIN_TOKEN` is unset; otherwise every call needs `Authorization: Bearer
<ADMIN_TOKEN>`, compared in constant time. One endpoint:

    GET /admin/receipts?ref=R[&tenant=T]

verifies the receipt chain first (every tenant's when no tenant is given; incrementally, from the
last record this worker verified), then answers the records whose `refDigest` is HMAC(R). A broken
chain is a 409 that names the tenant and the first bad record's stream id and returns no record.
The ref is never logged or stored: only its HMAC is compared.
"""

from __future__ import annotations

import hmac
import json
import logging
from urllib.parse import parse_qs, urlsplit

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.audit.receipts.chain import ReceiptError
from ext_proc.audit.receipts.record import ref_digest, valid_tenant
from ext_proc.audit.receipts.verify import ChainBroken
from ext_proc.dialects.providers import DEFAULT_PROVIDER
from ext_proc.errors import Refusal
from ext_proc.exchange.runtime import ReceiptStorage
from ext_proc.service import wire as envoy

log = logging.getLogger("cordon.admin")

RECEIPTS_PATH = "/admin/receipts"
MAX_REF_CHARS = 256


def _refuse(status: int, message: str) -> pb.ProcessingResponse:
    return envoy.refuse(Refusal(status, "admin", message, code="admin"), DEFAULT_PROVIDER)


def _query(path: str) -> dict[str, str] | str:
    """The query's parameters (each at most once), or what is wrong with it."""
    try:
        params = parse_qs(urlsplit(path).query, keep_blank_values=True, strict_parsing=False)
    except ValueError:
        return "the query string cannot be read"
    unknown = set(params) - {"ref", "tenant"}
    if unknown:
        return "unknown query parameter; known: ref, tenant"
    if any(len(values) != 1 for values in params.values()):
        return "each query parameter may be given once"
    return {name: values[0] for name, values in params.items()}


async def answer(
    method: str,
    path: str,
    bearer: str | None,
    *,
    token: str | None,
    store: ReceiptStorage | None,
    secret: bytes,
) -> pb.ProcessingResponse:
    if not token:
        return _refuse(404, "the admin API is closed (ADMIN_TOKEN is unset)")
    if not hmac.compare_digest((bearer or "").encode(), token.encode()):
        return _refuse(401, "a valid admin bearer token is required")
    if urlsplit(path).path.rstrip("/") != RECEIPTS_PATH:
        return _refuse(404, "no such admin endpoint; known: GET /admin/receipts?ref=R[&tenant=T]")
    if method != "GET":
        return _refuse(405, "use GET")
    params = _query(path)
    if isinstance(params, str):
        return _refuse(400, params)
    ref = params.get("ref", "")
    if not ref or len(ref) > MAX_REF_CHARS:
        return _refuse(400, f"ref is required (1 to {MAX_REF_CHARS} characters)")
    tenant = params.get("tenant")
    if tenant is not None and not valid_tenant(tenant):
        return _refuse(400, "tenant is not a tenant name")
    if store is None:
        return _refuse(503, "no receipt store is configured")
    digest = ref_digest(secret, ref)
    try:
        known = await store.tenants()
        if tenant is not None and tenant not in known:
            # Never an empty pass for a tenant that has no chain: an auditor would read it as one.
            return _refuse(404, "no receipt chain for this tenant")
        tenants = [tenant] if tenant is not None else known
        # Verify every chain before answering from any: a broken one is reported, not skipped.
        for name in tenants:
            result = await store.verify(name)
            if not result.ok:
                raise ChainBroken(result)
        records: list[dict[str, object]] = []
        for name in tenants:
            records.extend(r.to_json() for r in await store.find_by_ref_digest(name, digest))
    except ChainBroken as broken:
        result = broken.result
        log.error(
            json.dumps(
                {
                    "event": "receipt_chain_broken",
                    "tenant": result.tenant,
                    "id": result.bad_id,
                    "reason": result.reason,
                }
            )
        )
        body = {
            "error": {
                "message": "the receipt chain is broken; no record is answered until it is repaired",
                "type": "chain_broken",
                "tenant": result.tenant,
                "id": result.bad_id,
                "reason": result.reason,
            }
        }
        return envoy.answer(409, json.dumps(body, separators=(",", ":")).encode())
    except ReceiptError as exc:
        return envoy.refuse(
            Refusal(503, "audit", f"the receipt store cannot be read: {exc}"), DEFAULT_PROVIDER
        )
    records.sort(key=lambda r: str(r["time"]))
    answered: dict[str, object] = {"verified": tenants, "records": records}
    return envoy.answer(200, json.dumps(answered, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
