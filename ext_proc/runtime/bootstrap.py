"""Render Envoy's bootstrap (envoy/bootstrap.yaml.tmpl) from the settings, and the TLS material.

Routes are named; the ext_proc filter asks Envoy for `xds.route_name` with every request, so the
processor classifies a request by the route Envoy actually chose instead of re-implementing the
routing table. The upstream routes are rendered from `ROUTE_PROVIDERS` (ext_proc.dialects.routes):
the provider each leads to, and the prefix it strips.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import textwrap
from pathlib import Path
from string import Template

from ext_proc.dialects.routes import ROUTE_PROVIDERS
from ext_proc.runtime import hcm
from ext_proc.runtime.config import Settings, Upstream
from ext_proc.runtime.hcm import READY_ROUTE

TEMPLATE = Path(__file__).resolve().parents[2] / "envoy" / "bootstrap.yaml.tmpl"

ADMIN_ROUTE = "admin"
NOT_FOUND_ROUTE = "not-found"

STREAM_IDLE_TIMEOUT = "300s"
HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)

# Headers for the filter only: stripped by the processor and, should it ever not, by the route.
FILTER_HEADERS = ("x-cordon-subject", "x-tenant", "x-redact-mode")

_NOT_FOUND_BODY = (
    '{"error":{"message":"no route for this path","type":"invalid_request_error","code":"not_found"}}'
)


_NOT_READY_BODY = '{"status":"not ready"}'


def _upstream(name: str, match: str | None = None) -> str:
    """The route `name` of ROUTE_PROVIDERS: to its provider's cluster; a route with a prefix
    matches that prefix and strips it."""
    provider, prefix = ROUTE_PROVIDERS[name]
    if prefix:
        return _route(name, f'prefix: "{prefix}/"', provider.name, rewrite="/")
    assert match is not None, "a route without a prefix of its own says what it matches"
    return _route(name, match, provider.name)


def _route(name: str, match: str, cluster: str, *, rewrite: str | None = None) -> str:
    lines = [
        f"- name: {name}",
        f"  match: {{{match}, case_sensitive: false}}",
        "  route:",
        f"    cluster: {cluster}",
        "    auto_host_rewrite: true",
        "    timeout: 600s",
    ]
    if rewrite is not None:
        lines.append(f'    prefix_rewrite: "{rewrite}"')
    lines.append("  request_headers_to_remove: [" + ", ".join(FILTER_HEADERS) + "]")
    return "\n".join(lines)


def _local(name: str, match: str, status: int, body: str, *, filter_off: bool = False) -> str:
    lines = [
        f"- name: {name}",
        f"  match: {{{match}}}",
        "  direct_response:",
        f"    status: {status}",
        f"    body: {{inline_string: '{body}'}}",
    ]
    if filter_off:
        lines += [
            "  typed_per_filter_config:",
            "    envoy.filters.http.ext_proc:",
            '      "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute',
            "      disabled: true",
        ]
    return "\n".join(lines)


def render_routes() -> str:
    not_found = _local(NOT_FOUND_ROUTE, 'prefix: "/"', 404, _NOT_FOUND_BODY)
    by_authority = []
    for name in ("openai-authority", "anthropic-authority"):
        host = f"api.{ROUTE_PROVIDERS[name][0].name}.com"
        routes = "\n".join([_upstream(name, 'prefix: "/v1/"'), not_found])
        by_authority.append(
            f'- name: {name}\n  domains: ["{host}", "{host}:*"]\n  routes:\n' + textwrap.indent(routes, "  ")
        )
    local_routes = "\n".join(
        [
            _local("healthz", 'path: "/healthz"', 200, "ok", filter_off=True),
            # Answered by a worker (ready: it serves and its Redis answers); the 503 shows when no
            # worker says so, and the local reply mapper turns Envoy's own failure into a 503 too.
            _local(READY_ROUTE, 'path: "/readyz"', 503, _NOT_READY_BODY),
            # Answered by the processor (it sees request headers even on a direct_response route);
            # the 404 only shows should the processor ever let it through.
            _local(ADMIN_ROUTE, 'prefix: "/admin/", case_sensitive: false', 404, "{}"),
            _upstream("anthropic", 'path: "/v1/messages"'),
            _upstream("anthropic", 'prefix: "/v1/messages/"'),
            _upstream("openai", 'prefix: "/v1/"'),
            _upstream("openai-prefixed"),
            _upstream("anthropic-prefixed"),
            not_found,
        ]
    )
    local = '- name: local\n  domains: ["*"]\n  routes:\n' + textwrap.indent(local_routes, "  ")
    config = "name: cordon\nvirtual_hosts:\n" + "\n".join([*by_authority, local])
    return textwrap.indent(config, " " * 12)


ROUTER_FILTER = textwrap.dedent(
    """\
    - name: envoy.filters.http.router
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
    """
)


def render_filters(settings: Settings) -> str:
    ext_proc = textwrap.dedent(
        """\
        - name: envoy.filters.http.ext_proc
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
            grpc_service:
              envoy_grpc: {cluster_name: ext_proc}
              timeout: 300s
            failure_mode_allow: false
            allow_mode_override: true
            processing_mode:
              request_header_mode: SEND
              response_header_mode: SEND
              request_body_mode: BUFFERED
              response_body_mode: NONE
              request_trailer_mode: SKIP
              response_trailer_mode: SKIP
            request_attributes: ["xds.route_name"]
            # The processor rewrites every header value that carries a finding, x-envoy-* ones
            # included (a client on an internal address may send them): by default Envoy drops
            # such a change silently and forwards the original. A change Envoy still refuses is
            # an error, never a silent pass.
            mutation_rules: {allow_envoy: true, disallow_is_error: true}
            message_timeout: {timeout}s
            max_message_timeout: 300s
        """
    ).replace("{timeout}", str(settings.message_timeout_seconds))
    return textwrap.indent(ext_proc + ROUTER_FILTER, " " * 10)


def render_extproc_endpoints(settings: Settings) -> str:
    """The ext_proc cluster's endpoints: worker i's port, EXTPROC_PORT + i, for every worker."""
    address = settings.extproc_address
    endpoints = [
        f'- endpoint:\n    address:\n      socket_address: {{address: "{address}", port_value: {port}}}'
        for port in settings.extproc_ports
    ]
    return textwrap.indent("\n".join(endpoints), " " * 8)


def render_bench_listener(settings: Settings) -> str:
    """`make bench` only (BENCH_LISTEN_PORT): the plain listener without the ext_proc filter.

    Same routes, same upstream clusters, same Envoy: the difference between it and the plain
    listener is what the filter costs. Never rendered unless the setting is given.
    """
    if settings.bench_listen_port is None:
        return ""
    return _bench_listener(settings, "bench", settings.bench_listen_port, ROUTER_FILTER)


# The floors' ext_proc filter: nothing asked for beyond the phases, so its server costs only
# the round trips. 2 messages: both header phases; 4: the bodies buffered as well, the shape our
# processor has on a JSON exchange. A streamed reply is switched to STREAMED by the server, as
# ours does, so the time to first token stays comparable.
_FLOOR_FILTER = """\
- name: envoy.filters.http.ext_proc
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
    grpc_service:
      envoy_grpc: {{cluster_name: {cluster}}}
      timeout: 300s
    failure_mode_allow: false
    allow_mode_override: {override}
    processing_mode:
      request_header_mode: SEND
      response_header_mode: SEND
      request_body_mode: {body}
      response_body_mode: {body}
      request_trailer_mode: SKIP
      response_trailer_mode: SKIP
    message_timeout: {timeout}s
"""

BENCH_FLOOR_CLUSTER = "bench_floor"


def render_floor_listeners(settings: Settings) -> str:
    """`make bench` only (BENCH_FLOOR2_PORT, BENCH_FLOOR4_PORT): listeners whose ext_proc filter
    talks to the bench's pass-through server (tests/bench/floor.py), the least any processor of
    that shape can cost. Never rendered unless the settings are given."""
    floors = [
        ("bench_floor2", settings.bench_floor2_port, "NONE", "false"),
        ("bench_floor4", settings.bench_floor4_port, "BUFFERED", "true"),
    ]
    listeners = []
    for name, port, body, override in floors:
        if port is None:
            continue
        timeout = settings.message_timeout_seconds
        ext_proc = _FLOOR_FILTER.format(
            cluster=BENCH_FLOOR_CLUSTER, body=body, override=override, timeout=timeout
        )
        listeners.append(_bench_listener(settings, name, port, ext_proc + ROUTER_FILTER))
    return "".join(listeners)


def render_floor_cluster(settings: Settings) -> str:
    """The cluster of the floors' server: HTTP/2 with the ext_proc cluster's windows, so a floor
    differs from our processor in what its server does only."""
    if settings.bench_floor_extproc_port is None or (
        settings.bench_floor2_port is None and settings.bench_floor4_port is None
    ):
        return ""
    cluster = textwrap.dedent(
        f"""\
        - name: {BENCH_FLOOR_CLUSTER}
          type: STATIC
          connect_timeout: 1s
          typed_extension_protocol_options:
            envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
              "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
              explicit_http_config:
                http2_protocol_options:
                  initial_stream_window_size: 16777216
                  initial_connection_window_size: 33554432
          load_assignment:
            cluster_name: {BENCH_FLOOR_CLUSTER}
            endpoints:
            - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{address: "127.0.0.1", port_value: {settings.bench_floor_extproc_port}}}
        """
    )
    return textwrap.indent(cluster, "  ")


def _bench_listener(settings: Settings, name: str, port: int, http_filters: str) -> str:
    """A listener of `make bench`: the plain listener's routes and normalisation, its own filters."""
    listener = textwrap.dedent(
        f"""\
        - name: {name}
          address:
            socket_address: {{address: "{settings.listen_address}", port_value: {port}}}
          per_connection_buffer_limit_bytes: {settings.max_body_bytes}
          filter_chains:
          - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": {HCM_TYPE}
                stat_prefix: {name}
                normalize_path: true
                merge_slashes: true
                path_with_escaped_slashes_action: UNESCAPE_AND_FORWARD
                generate_request_id: false
                stream_idle_timeout: {STREAM_IDLE_TIMEOUT}
                route_config:
        """
    )
    # The listener sits under `listeners:` (two spaces); routes and filters come indented already.
    filters = "          http_filters:\n" + textwrap.indent(http_filters, " " * 10)
    return textwrap.indent(listener, "  ") + render_routes() + "\n" + filters


def render_upstream_tls(upstream: Upstream, settings: Settings) -> str:
    if not upstream.tls:
        return ""
    by_ip = _discovery(upstream.host) == "STATIC"
    # SNI carries host names only (RFC 6066); an upstream given by address is matched by its IP SAN.
    sni = "" if by_ip else f"\n            sni: {upstream.host}"
    san_type = "IP_ADDRESS" if by_ip else "DNS"
    fragment = textwrap.dedent(
        f"""\
        transport_socket:
          name: envoy.transport_sockets.tls
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext{sni}
            common_tls_context:
              validation_context:
                trusted_ca: {{filename: "{settings.upstream_ca_file}"}}
                match_typed_subject_alt_names:
                - san_type: {san_type}
                  matcher: {{exact: "{upstream.host}"}}
        """
    )
    return textwrap.indent(fragment, "    ")


def _discovery(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "LOGICAL_DNS"
    return "STATIC"


def render(settings: Settings, *, openai: Upstream, anthropic: Upstream, cert: Path, key: Path) -> str:
    values = {
        "ENVOY_ADMIN_PORT": settings.envoy_admin_port,
        "LISTEN_ADDRESS": settings.listen_address,
        "LISTEN_PORT": settings.listen_port,
        "TLS_PORT": settings.tls_port,
        "MAX_BODY_BYTES": settings.max_body_bytes,
        "STREAM_IDLE_TIMEOUT": STREAM_IDLE_TIMEOUT,
        "EXTPROC_ENDPOINTS": render_extproc_endpoints(settings),
        "TLS_CERT_FILE": cert,
        "TLS_KEY_FILE": key,
        "ROUTES": render_routes(),
        "FILTERS": render_filters(settings),
        "BENCH_LISTENER": render_bench_listener(settings) + render_floor_listeners(settings),
        "BENCH_CLUSTERS": render_floor_cluster(settings),
        "HCM_EXTRAS": hcm.render(settings, 10),
    }
    for upstream in (openai, anthropic):
        prefix = upstream.name.upper()
        values[f"{prefix}_HOST"] = upstream.host
        values[f"{prefix}_PORT"] = upstream.port
        values[f"{prefix}_DISCOVERY"] = _discovery(upstream.host)
        values[f"{prefix}_TLS"] = render_upstream_tls(upstream, settings)
    return Template(TEMPLATE.read_text()).substitute(values)


def ensure_tls_material(settings: Settings) -> tuple[Path, Path, Path | None]:
    """The listener's certificate and key: the operator's files, or a self-signed pair made once.

    Returns (cert, key, ca) where ca is the generated CA clients can trust (`curl --cacert`), or
    None for operator-provided material.
    """
    if settings.tls_cert_file and settings.tls_key_file:
        return settings.tls_cert_file, settings.tls_key_file, None
    tls_dir = settings.run_dir / "tls"
    cert, key, ca = tls_dir / "cert.pem", tls_dir / "key.pem", tls_dir / "ca.pem"
    if cert.exists() and key.exists() and ca.exists():
        return cert, key, ca
    tls_dir.mkdir(parents=True, exist_ok=True)
    _generate_self_signed(cert, key, ca)
    return cert, key, ca


def _generate_self_signed(cert_path: Path, key_path: Path, ca_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cordon local CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=825))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=397))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = leaf_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Created 0600 from the start: the key is never readable by others, not even for a moment.
    with contextlib.suppress(FileNotFoundError):
        key_path.unlink()
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as key_file:
        key_file.write(key_pem)
    cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
