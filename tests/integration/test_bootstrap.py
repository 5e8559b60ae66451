"""Envoy bootstrap rendering (validated by the real Envoy), settings from the environment, TLS material."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import ssl
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from ext_proc.dialects.routes import ROUTE_PROVIDERS
from ext_proc.runtime import bootstrap
from ext_proc.runtime.config import ConfigError, Settings, parse_upstream
from ext_proc.runtime.hcm import READY_ROUTE
from ext_proc.runtime.stack import Stack, StackError
from tests.support.harness import assert_envoy_accepts, free_port, free_ports

MAX_BODY = 1_048_576  # not the default, so a hard-coded limit would show
EXT_PROC = "envoy.filters.http.ext_proc"
FILTER_HEADERS = {"x-cordon-subject", "x-tenant", "x-redact-mode"}
PORT_SETTINGS = ("LISTEN_PORT", "TLS_PORT", "ENVOY_ADMIN_PORT", "EXTPROC_PORT", "METRICS_PORT")


@dataclass(frozen=True)
class Rendered:
    settings: Settings
    path: Path
    doc: dict[str, Any]
    cert: Path
    key: Path


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A generated cert, key and CA, made through another settings object."""
    cert, key, ca = bootstrap.ensure_tls_material(Settings.from_env({"RUN_DIR": str(directory)}))
    assert ca is not None
    return cert, key, ca


def render_case(case: str, tmp: Path, **extra: str) -> Rendered:
    gen_cert, gen_key, gen_ca = make_tls(tmp / "generated")
    env = {
        "RUN_DIR": str(tmp / "run"),
        "LISTEN_ADDRESS": "0.0.0.0",
        "LISTEN_PORT": "18000",
        "TLS_PORT": "18443",
        "ENVOY_ADMIN_PORT": "19901",
        "EXTPROC_PORT": "15051",
        "WORKERS": "2",  # not the core count, so the endpoints do not depend on the machine
        "MAX_BODY_BYTES": str(MAX_BODY),
        "UPSTREAM_CA_FILE": str(gen_ca),  # any readable CA bundle: keeps the test hermetic
    }
    if case == "https-hostnames":
        env |= {
            "OPENAI_UPSTREAM": "https://api.openai.com",
            "ANTHROPIC_UPSTREAM": "https://api.anthropic.com",
        }
    else:
        env |= {"OPENAI_UPSTREAM": "http://127.0.0.1:18080", "ANTHROPIC_UPSTREAM": "http://127.0.0.1:18081"}
    if case == "operator-tls":
        env |= {"TLS_CERT_FILE": str(gen_cert), "TLS_KEY_FILE": str(gen_key)}
    settings = Settings.from_env(env | extra)
    cert, key, ca = bootstrap.ensure_tls_material(settings)
    if case == "operator-tls":
        assert (cert, key, ca) == (gen_cert, gen_key, None)
    assert settings.openai_upstream is not None
    assert settings.anthropic_upstream is not None
    text = bootstrap.render(
        settings,
        openai=settings.openai_upstream,
        anthropic=settings.anthropic_upstream,
        cert=cert.resolve(),
        key=key.resolve(),
    )
    path = tmp / "envoy.yaml"
    path.write_text(text)
    settings.access_log_path.parent.mkdir(parents=True, exist_ok=True)  # Envoy opens it at start
    return Rendered(settings, path, yaml.safe_load(text), cert.resolve(), key.resolve())


@pytest.fixture(scope="module", params=["plain-http", "https-hostnames", "operator-tls"])
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return render_case(request.param, tmp_path_factory.mktemp(request.param))


def listeners(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["static_resources"]["listeners"])


def hcm(listener: dict[str, Any]) -> dict[str, Any]:
    (chain,) = listener["filter_chains"]
    (manager,) = chain["filters"]
    assert manager["name"] == "envoy.filters.network.http_connection_manager"
    return dict(manager["typed_config"])


def clusters(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["static_resources"]["clusters"]}


def virtual_hosts(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for listener in listeners(doc):
        yield from hcm(listener)["route_config"]["virtual_hosts"]


def routes(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for vhost in virtual_hosts(doc):
        yield from vhost["routes"]


# --- the rendered bootstrap ---------------------------------------------------------------------


def test_envoy_validates_the_bootstrap(rendered: Rendered) -> None:
    """The real Envoy accepts the rendered file (`--mode validate`)."""
    assert_envoy_accepts(rendered.path)


def test_two_listeners_with_the_settings_addresses(rendered: Rendered) -> None:
    """A plain and a TLS listener on LISTEN_ADDRESS, with the configured ports."""
    by_name = {listener["name"]: listener for listener in listeners(rendered.doc)}
    assert set(by_name) == {"plain", "tls"}
    for name, port in (("plain", 18000), ("tls", 18443)):
        assert by_name[name]["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": port}
    tls = by_name["tls"]["filter_chains"][0]["transport_socket"]["typed_config"]
    (pair,) = tls["common_tls_context"]["tls_certificates"]
    assert pair == {
        "certificate_chain": {"filename": str(rendered.cert)},
        "private_key": {"filename": str(rendered.key)},
    }
    assert "transport_socket" not in by_name["plain"]["filter_chains"][0]


def test_ext_proc_filter_fails_closed_and_buffers(rendered: Rendered) -> None:
    """Every listener runs exactly one ext_proc filter: fail closed, buffered body, mode override."""
    for listener in listeners(rendered.doc):
        filters = hcm(listener)["http_filters"]
        ext = [f for f in filters if f["name"] == EXT_PROC]
        assert len(ext) == 1
        config = ext[0]["typed_config"]
        assert config["failure_mode_allow"] is False
        assert config["processing_mode"]["request_body_mode"] == "BUFFERED"
        assert config["allow_mode_override"] is True
        assert config["grpc_service"]["envoy_grpc"]["cluster_name"] == "ext_proc"
        assert "xds.route_name" in config["request_attributes"]
        assert filters[-1]["name"] == "envoy.filters.http.router"
        assert filters.index(ext[0]) < len(filters) - 1


def test_paths_are_normalised_on_both_listeners(rendered: Rendered) -> None:
    """normalize_path, merge_slashes and UNESCAPE_AND_FORWARD on every listener."""
    for listener in listeners(rendered.doc):
        manager = hcm(listener)
        assert manager["normalize_path"] is True
        assert manager["merge_slashes"] is True
        assert manager["path_with_escaped_slashes_action"] == "UNESCAPE_AND_FORWARD"


def test_no_listener_adds_a_request_id(rendered: Rendered) -> None:
    """Envoy's own x-request-id would be one more value for the provider on every request."""
    for listener in listeners(rendered.doc):
        assert hcm(listener)["generate_request_id"] is False


def test_buffer_limits_equal_max_body_bytes(rendered: Rendered) -> None:
    """Listener and upstream cluster buffers are MAX_BODY_BYTES."""
    assert rendered.settings.max_body_bytes == MAX_BODY
    for listener in listeners(rendered.doc):
        assert listener["per_connection_buffer_limit_bytes"] == MAX_BODY
    for name in ("openai", "anthropic"):
        assert clusters(rendered.doc)[name]["per_connection_buffer_limit_bytes"] == MAX_BODY


def test_admin_listens_on_loopback_only(rendered: Rendered) -> None:
    """Envoy's admin binds 127.0.0.1 even when the listeners bind every address."""
    assert rendered.doc["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 19901}


def extproc_endpoints(doc: dict[str, Any]) -> list[dict[str, Any]]:
    (locality,) = clusters(doc)["ext_proc"]["load_assignment"]["endpoints"]
    return [item["endpoint"]["address"]["socket_address"] for item in locality["lb_endpoints"]]


def test_ext_proc_cluster(rendered: Rendered) -> None:
    """The processor cluster speaks HTTP/2 to one endpoint per worker (EXTPROC_PORT + i), balanced
    by least request, each health-checked every second and ejected when it refuses a connection;
    connections are never retired early."""
    cluster = clusters(rendered.doc)["ext_proc"]
    assert extproc_endpoints(rendered.doc) == [
        {"address": "127.0.0.1", "port_value": 15051},
        {"address": "127.0.0.1", "port_value": 15052},
    ]
    assert cluster["lb_policy"] == "LEAST_REQUEST"
    options = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2_protocol_options" in options["explicit_http_config"]
    assert "common_http_protocol_options" not in options  # no max_requests_per_connection
    (check,) = cluster["health_checks"]
    assert check["grpc_health_check"] == {"service_name": "liveness"}
    assert check["interval"] == check["no_traffic_interval"] == "1s"
    # Ejected at the first refused connection, never for an answer (5xx or gRPC error).
    outliers = cluster["outlier_detection"]
    assert outliers["split_external_local_origin_errors"] is True
    assert outliers["consecutive_local_origin_failure"] == 1
    assert outliers["enforcing_consecutive_local_origin_failure"] == 100
    assert outliers["enforcing_consecutive_5xx"] == outliers["enforcing_success_rate"] == 0
    assert outliers["max_ejection_percent"] == 100


@pytest.mark.parametrize("workers", [1, 3])
def test_ext_proc_cluster_lists_every_worker(workers: int, tmp_path: Path) -> None:
    """WORKERS endpoints on consecutive ports from EXTPROC_PORT, at EXTPROC_ADDRESS; Envoy accepts
    the file."""
    case = render_case("plain-http", tmp_path, WORKERS=str(workers), EXTPROC_ADDRESS="::1")
    assert extproc_endpoints(case.doc) == [
        {"address": "::1", "port_value": 15051 + i} for i in range(workers)
    ]
    assert clusters(case.doc)["ext_proc"]["lb_policy"] == "LEAST_REQUEST"
    assert_envoy_accepts(case.path)


def test_upstream_clusters(rendered: Rendered) -> None:
    """Each provider cluster points at its upstream; https ones verify SNI and the SAN."""
    for name in ("openai", "anthropic"):
        upstream = getattr(rendered.settings, f"{name}_upstream")
        cluster = clusters(rendered.doc)[name]
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        assert endpoint["address"]["socket_address"] == {
            "address": upstream.host,
            "port_value": upstream.port,
        }
        if not upstream.tls:
            assert cluster["type"] == "STATIC"
            assert "transport_socket" not in cluster
            continue
        assert cluster["type"] == "LOGICAL_DNS"
        assert upstream.port == 443
        tls = cluster["transport_socket"]["typed_config"]
        assert tls["@type"].endswith("UpstreamTlsContext")
        assert tls["sni"] == upstream.host == f"api.{name}.com"
        validation = tls["common_tls_context"]["validation_context"]
        assert validation["trusted_ca"] == {"filename": str(rendered.settings.upstream_ca_file)}
        assert validation["match_typed_subject_alt_names"] == [
            {"san_type": "DNS", "matcher": {"exact": upstream.host}}
        ]


def test_every_upstream_route_strips_filter_headers(rendered: Rendered) -> None:
    """Routes that reach a provider remove x-cordon-subject (and the other filter headers)."""
    upstream_routes = [r for r in routes(rendered.doc) if "route" in r]
    assert upstream_routes
    for route in upstream_routes:
        assert set(route["request_headers_to_remove"]) >= FILTER_HEADERS
        provider, prefix = ROUTE_PROVIDERS[route["name"]]
        assert route["route"]["cluster"] == provider.name
        if prefix:
            assert route["match"]["prefix"] == prefix + "/"
            assert route["route"]["prefix_rewrite"] == "/"
        assert route["match"]["case_sensitive"] is False


def test_routes_named_as_the_classifier_expects(rendered: Rendered) -> None:
    """The route names the bootstrap renders are exactly the ones `ROUTE_PROVIDERS` knows."""
    names = {r["name"] for r in routes(rendered.doc)}
    upstream = {r["name"] for r in routes(rendered.doc) if "route" in r}
    assert upstream == set(ROUTE_PROVIDERS)
    assert {bootstrap.ADMIN_ROUTE, bootstrap.NOT_FOUND_ROUTE, "healthz"} <= names


def test_catch_all_is_a_local_404(rendered: Rendered) -> None:
    """Every virtual host ends with a prefix-/ direct 404: an unlisted path never goes upstream."""
    for vhost in virtual_hosts(rendered.doc):
        last = vhost["routes"][-1]
        assert last["name"] == bootstrap.NOT_FOUND_ROUTE
        assert last["match"] == {"prefix": "/"}
        assert last["direct_response"]["status"] == 404
        assert "route" not in last


def test_virtual_hosts(rendered: Rendered) -> None:
    """Authority hosts for both providers and a catch-all local host, on both listeners."""
    domains = [tuple(v["domains"]) for v in virtual_hosts(rendered.doc)]
    expected = [
        ("api.openai.com", "api.openai.com:*"),
        ("api.anthropic.com", "api.anthropic.com:*"),
        ("*",),
    ]
    assert domains == expected * 2


def test_healthz_disables_ext_proc_and_admin_does_not(rendered: Rendered) -> None:
    """/healthz is answered by Envoy without the filter; /admin/ still goes through the processor."""
    by_name = {r["name"]: r for r in routes(rendered.doc)}
    health = by_name["healthz"]
    assert health["match"] == {"path": "/healthz"}
    assert health["direct_response"]["status"] == 200
    assert health["typed_per_filter_config"][EXT_PROC]["disabled"] is True
    admin = by_name[bootstrap.ADMIN_ROUTE]
    assert "typed_per_filter_config" not in admin
    assert "route" not in admin


def test_readyz_goes_through_the_processor(rendered: Rendered) -> None:
    """/readyz is answered by a worker (the filter stays on); unanswered, the route says 503."""
    by_name = {r["name"]: r for r in routes(rendered.doc)}
    ready = by_name[READY_ROUTE]
    assert ready["match"] == {"path": "/readyz"}
    assert ready["direct_response"]["status"] == 503
    assert "typed_per_filter_config" not in ready


def test_access_log_and_local_replies_on_every_filtered_listener(rendered: Rendered) -> None:
    """Each listener writes JSON access lines without a header value or the query string, and
    maps Envoy's own 413, and its 500 for a reply too large to read whole (as a 502), to the
    route's provider shape, and an unanswered /readyz to 503."""
    for item in listeners(rendered.doc):
        manager = hcm(item)
        (log,) = manager["access_log"]
        config = log["typed_config"]
        assert config["path"] == str(rendered.settings.access_log_path)
        fields = config["log_format"]["json_format"]
        assert {"ts", "level", "method", "path", "status", "flags", "upstream_cluster"} <= set(fields)
        assert {"duration_ms", "bytes_received", "bytes_sent"} <= set(fields)
        operators = " ".join(fields.values())
        assert "%REQ(:PATH)%" not in operators  # the path with its query string
        assert all(v.startswith("%REQ(:") for v in re.findall(r"%REQ\([^)]*\)%", operators))
        expressions = [
            m["filter"]["extension_filter"]["typed_config"]["expression"]
            for m in (manager["local_reply_config"]["mappers"])
        ]
        assert expressions[0].startswith(f'xds.route_name == "{READY_ROUTE}"')
        too_large, reply_too_large = expressions[1:3], expressions[3:]
        assert len(too_large) == len(reply_too_large) == 2
        assert all("413" in e and "cordon_" in e for e in too_large)
        assert all('"response_payload_too_large"' in e for e in reply_too_large)
        anthropic_routes = sorted(n for n, (p, _) in ROUTE_PROVIDERS.items() if p.name == "anthropic")
        assert (
            json.dumps(anthropic_routes) in too_large[0]
            and json.dumps(anthropic_routes) in reply_too_large[0]
        )
        assert manager["local_reply_config"]["mappers"][3]["status_code"] == 502


def test_https_upstream_by_ip_matches_an_ip_san(tmp_path: Path) -> None:
    """An https upstream given by IP address is verified against the certificate's IP SAN."""
    settings = Settings.from_env({"RUN_DIR": str(tmp_path)})
    fragment = yaml.safe_load(
        bootstrap.render_upstream_tls(parse_upstream("openai", "https://10.1.2.3"), settings)
    )
    validation = fragment["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"]
    assert validation["match_typed_subject_alt_names"][0]["san_type"] == "IP_ADDRESS"


# --- the bench-only listener (BENCH_LISTEN_PORT) -------------------------------------------------


@pytest.fixture(scope="module")
def with_bench(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return render_case("plain-http", tmp_path_factory.mktemp("bench"), BENCH_LISTEN_PORT="18111")


def test_no_bench_listener_unless_set(rendered: Rendered) -> None:
    """Without BENCH_LISTEN_PORT there is no listener that skips the filter."""
    assert rendered.settings.bench_listen_port is None
    assert "bench" not in {listener["name"] for listener in listeners(rendered.doc)}


def test_bench_listener_has_no_ext_proc_filter(with_bench: Rendered) -> None:
    """BENCH_LISTEN_PORT adds a third listener on LISTEN_ADDRESS whose only HTTP filter is the router."""
    by_name = {listener["name"]: listener for listener in listeners(with_bench.doc)}
    assert set(by_name) == {"plain", "tls", "bench"}
    bench = by_name["bench"]
    assert bench["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 18111}
    assert [f["name"] for f in hcm(bench)["http_filters"]] == ["envoy.filters.http.router"]
    assert EXT_PROC not in yaml.safe_dump(hcm(bench)["http_filters"])
    assert bench["per_connection_buffer_limit_bytes"] == MAX_BODY
    # The filtered listeners keep theirs.
    for name in ("plain", "tls"):
        assert EXT_PROC in [f["name"] for f in hcm(by_name[name])["http_filters"]]


def test_bench_listener_has_the_same_routes_and_clusters(with_bench: Rendered, tmp_path: Path) -> None:
    """Same route table and normalisation as the plain listener; the clusters are untouched."""
    by_name = {listener["name"]: listener for listener in listeners(with_bench.doc)}
    bench, plain = hcm(by_name["bench"]), hcm(by_name["plain"])
    assert bench["route_config"] == plain["route_config"]
    same = ("normalize_path", "merge_slashes", "path_with_escaped_slashes_action", "generate_request_id")
    for key in (*same, "stream_idle_timeout"):
        assert bench[key] == plain[key]
    without = render_case("plain-http", tmp_path)
    assert clusters(with_bench.doc) == clusters(without.doc)


def test_envoy_validates_the_bootstrap_with_a_bench_listener(with_bench: Rendered) -> None:
    """The real Envoy accepts the third listener (its routes still name the ext_proc per-route config)."""
    assert_envoy_accepts(with_bench.path)


def test_a_taken_bench_port_stops_the_stack_before_it_starts(tmp_path: Path) -> None:
    """The stack's port check covers BENCH_LISTEN_PORT when it is set."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        env = {name: str(free_port()) for name in PORT_SETTINGS}
        env |= {
            "WORKERS": "1",  # EXTPROC_PORT alone: the port after it was not handed out
            "RUN_DIR": str(tmp_path),
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "OPENAI_UPSTREAM": "http://127.0.0.1:1",
            "ANTHROPIC_UPSTREAM": "http://127.0.0.1:1",
            "BENCH_LISTEN_PORT": str(taken),
        }
        with pytest.raises(StackError, match="BENCH_LISTEN_PORT"):
            Stack(Settings.from_env(env), quiet=True)._check_ports()


def stack_ports_env(tmp_path: Path, workers: int) -> dict[str, str]:
    env = {name: str(free_port()) for name in PORT_SETTINGS if name != "EXTPROC_PORT"}
    return env | {
        "EXTPROC_PORT": str(free_ports(workers)),
        "WORKERS": str(workers),
        "RUN_DIR": str(tmp_path),
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "OPENAI_UPSTREAM": "http://127.0.0.1:1",
        "ANTHROPIC_UPSTREAM": "http://127.0.0.1:1",
    }


def test_a_taken_worker_port_stops_the_stack_before_it_starts(tmp_path: Path) -> None:
    """The stack checks every worker's port, EXTPROC_PORT + i, and names the one taken."""
    env = stack_ports_env(tmp_path, 3)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", int(env["EXTPROC_PORT"]) + 2))
        holder.listen()
        with pytest.raises(StackError, match=r"EXTPROC_PORT \+ 2, worker 2\) is taken; set EXTPROC_PORT"):
            Stack(Settings.from_env(env), quiet=True)._check_ports()


def test_a_port_wanted_twice_stops_the_stack(tmp_path: Path) -> None:
    """A worker's port that is also a listener's is refused before anything binds."""
    env = stack_ports_env(tmp_path, 2)
    env["LISTEN_PORT"] = str(int(env["EXTPROC_PORT"]) + 1)
    with pytest.raises(StackError, match="is both LISTEN_PORT and EXTPROC_PORT \\+ 1, worker 1"):
        Stack(Settings.from_env(env), quiet=True)._check_ports()


# --- settings -------------------------------------------------------------------------------------


def test_defaults() -> None:
    """An empty environment gives the documented defaults."""
    s = Settings.from_env({})
    assert (s.listen_port, s.tls_port, s.envoy_admin_port, s.extproc_port) == (10000, 10443, 9901, 50051)
    assert s.max_body_bytes == 33554432
    assert s.policy_dir == Path("policies")
    assert s.run_dir == Path(".run")
    assert s.openai_upstream is None
    assert s.anthropic_upstream is None
    assert s.redis_url is None
    assert s.admin_token is None
    assert s.trust_tenant_header is False
    assert s.tls_cert_file is None
    assert s.tls_key_file is None
    assert s.bench_listen_port is None


@pytest.mark.parametrize(
    ("url", "scheme", "host", "port"),
    [
        ("https://api.openai.com", "https", "api.openai.com", 443),
        ("https://api.anthropic.com/", "https", "api.anthropic.com", 443),
        ("http://127.0.0.1:18080", "http", "127.0.0.1", 18080),
        ("http://fake-upstream", "http", "fake-upstream", 80),
        ("HTTPS://API.OPENAI.COM:8443", "https", "api.openai.com", 8443),
    ],
)
def test_parse_upstream(url: str, scheme: str, host: str, port: int) -> None:
    """Scheme, host and port (default by scheme) of an upstream URL."""
    upstream = parse_upstream("openai", url)
    assert (upstream.scheme, upstream.host, upstream.port) == (scheme, host, port)
    assert upstream.tls == (scheme == "https")


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"LISTEN_PORT": "http"}, "LISTEN_PORT"),
        ({"LISTEN_PORT": "0"}, "LISTEN_PORT"),
        ({"TLS_PORT": "65536"}, "TLS_PORT"),
        ({"ENVOY_ADMIN_PORT": "-1"}, "ENVOY_ADMIN_PORT"),
        ({"EXTPROC_PORT": "50051.5"}, "EXTPROC_PORT"),
        ({"WORKERS": "0"}, "WORKERS"),
        ({"MAX_BODY_BYTES": "10"}, "MAX_BODY_BYTES"),
        ({"OPENAI_UPSTREAM": "https://api.openai.com/v1"}, "OPENAI_UPSTREAM"),
        ({"ANTHROPIC_UPSTREAM": "https://api.anthropic.com/v1/messages"}, "ANTHROPIC_UPSTREAM"),
        ({"OPENAI_UPSTREAM": "https://api.openai.com?x=1"}, "OPENAI_UPSTREAM"),
        ({"OPENAI_UPSTREAM": "ftp://files.example.com"}, "OPENAI_UPSTREAM"),
        ({"ANTHROPIC_UPSTREAM": "api.anthropic.com"}, "ANTHROPIC_UPSTREAM"),
        ({"OPENAI_UPSTREAM": "http://"}, "OPENAI_UPSTREAM"),
        ({"TLS_CERT_FILE": "/tmp/cert.pem"}, "TLS_CERT_FILE"),
        ({"TLS_KEY_FILE": "/tmp/key.pem"}, "TLS_KEY_FILE"),
        ({"TRUST_TENANT_HEADER": "maybe"}, "TRUST_TENANT_HEADER"),
        ({"TRUST_TENANT_HEADER": "2"}, "TRUST_TENANT_HEADER"),
        ({"BENCH_LISTEN_PORT": "0"}, "BENCH_LISTEN_PORT"),
        ({"BENCH_LISTEN_PORT": "bench"}, "BENCH_LISTEN_PORT"),
        ({"ADMIN_TOKEN": "short"}, "ADMIN_TOKEN"),
        ({"ADMIN_TOKEN": "a" * 20}, "ADMIN_TOKEN"),  # long but not random
        ({"RECEIPT_SECRET": "not-long-enough"}, "RECEIPT_SECRET"),
        ({"RECEIPT_SECRET": "a" * 40}, "RECEIPT_SECRET"),  # long but not random
        ({"TENANT_SECRET": "tenant-secret-too-short"}, "TENANT_SECRET"),
        ({"TENANT_SECRET": "ab" * 20}, "TENANT_SECRET"),  # long but not random
        ({"TENANT_SECRET": "  " + "x" * 31 + "y "}, "TENANT_SECRET"),  # trimmed first
        ({"REDIS_TIMEOUT_MS": "5"}, "REDIS_TIMEOUT_MS"),
        ({"OCR_WORKERS": "0"}, "OCR_WORKERS"),
        ({"OCR_BUDGET_SECONDS": "300"}, "OCR_BUDGET_SECONDS"),
        ({"METRICS_PORT": "0"}, "METRICS_PORT"),
        ({"EXTPROC_PORT": "65535", "WORKERS": "2"}, "EXTPROC_PORT \\+ WORKERS"),
        ({"EXTPROC_PORT": "9463", "WORKERS": "2", "METRICS_PORT": "9464"}, "METRICS_PORT 9464"),
    ],
)
def test_bad_settings_raise_config_error(env: dict[str, str], names: str) -> None:
    """A setting that cannot work is a ConfigError naming the setting."""
    with pytest.raises(ConfigError, match=names):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("", False),
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        (" on ", True),
        ("false", False),
    ],
)
def test_booleans(raw: str, value: bool) -> None:
    """Boolean settings take the usual spellings."""
    assert Settings.from_env({"TRUST_TENANT_HEADER": raw}).trust_tenant_header is value


def test_secrets_are_trimmed_and_never_echoed() -> None:
    """A Secret mounted as a file ends with a newline; the token is compared without it. A weak
    secret's error names the setting, not the value."""
    token = "tok-0123456789abcdef-tok"
    assert Settings.from_env({"ADMIN_TOKEN": token + "\n"}).admin_token == token
    secret = "receipt-secret-0123456789abcdefghijkl"
    assert Settings.from_env({"RECEIPT_SECRET": f" {secret}\n"}).receipt_secret == secret
    tenant = "tenant-secret-0123456789abcdefghijkl"
    assert Settings.from_env({"TENANT_SECRET": f"{tenant}\r\n"}).tenant_secret == tenant
    assert Settings.from_env({"TENANT_SECRET": " \n"}).tenant_secret is None
    with pytest.raises(ConfigError) as weak:
        Settings.from_env({"TENANT_SECRET": "short-tenant-secret"})
    assert "short-tenant-secret" not in str(weak.value) and "TENANT_SECRET" in str(weak.value)
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"ADMIN_TOKEN": "hunter2"})
    assert "hunter2" not in str(info.value)


def test_upstream_error_names_no_secret() -> None:
    """The message names the setting, not the URL (which may carry credentials)."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"OPENAI_UPSTREAM": "https://user:hunter2@api.openai.com/v1"})
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:http"])
def test_bad_upstream_port_is_a_config_error(url: str) -> None:
    """An impossible port in an upstream URL is a ConfigError."""
    with pytest.raises(ConfigError):
        Settings.from_env({"OPENAI_UPSTREAM": url})


def test_upstream_port_zero_is_refused() -> None:
    """Port 0 cannot be an upstream: refused, not replaced by the scheme's default."""
    with pytest.raises(ConfigError):
        parse_upstream("openai", "http://127.0.0.1:0")


# --- TLS material ---------------------------------------------------------------------------------


def test_tls_material_is_made_once_and_reused(tmp_path: Path) -> None:
    """Cert, key and CA are created under RUN_DIR/tls, then the same bytes are returned."""
    settings = Settings.from_env({"RUN_DIR": str(tmp_path)})
    first = bootstrap.ensure_tls_material(settings)
    cert, key, ca = first
    assert ca is not None
    assert {cert, key, ca} == {tmp_path / "tls" / n for n in ("cert.pem", "key.pem", "ca.pem")}
    before = [p.read_bytes() for p in (cert, key, ca)]
    assert bootstrap.ensure_tls_material(settings) == first
    assert [p.read_bytes() for p in (cert, key, ca)] == before


def test_tls_material_regenerated_when_part_is_missing(tmp_path: Path) -> None:
    """A lost CA makes a fresh, consistent set rather than a cert no CA vouches for."""
    settings = Settings.from_env({"RUN_DIR": str(tmp_path)})
    cert, _key, ca = bootstrap.ensure_tls_material(settings)
    assert ca is not None
    old = cert.read_bytes()
    ca.unlink()
    cert2, _key2, ca2 = bootstrap.ensure_tls_material(settings)
    assert ca2 is not None
    assert cert2.read_bytes() != old
    leaf = x509.load_pem_x509_certificate(cert2.read_bytes())
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(ca2.read_bytes()))


def test_key_file_is_private(tmp_path: Path) -> None:
    """The private key file is readable by its owner only."""
    _cert, key, _ca = bootstrap.ensure_tls_material(Settings.from_env({"RUN_DIR": str(tmp_path)}))
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_key_file_is_never_readable_by_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key file is created 0600 by the very call that creates it: no moment it is readable by others."""
    created: list[tuple[int, int]] = []
    original = os.open

    def spy(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        if Path(path).name == "key.pem":
            created.append((flags, mode))
        return original(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    old_umask = os.umask(0o000)  # even with a permissive umask
    try:
        bootstrap.ensure_tls_material(Settings.from_env({"RUN_DIR": str(tmp_path)}))
    finally:
        os.umask(old_umask)
    assert len(created) == 1
    flags, mode = created[0]
    assert flags & os.O_CREAT and flags & os.O_EXCL
    assert mode == 0o600
    assert stat.S_IMODE((tmp_path / "tls" / "key.pem").stat().st_mode) == 0o600


def test_leaf_certificate(tmp_path: Path) -> None:
    """The leaf names localhost, 127.0.0.1 and ::1, is signed by the CA and matches the key."""
    cert, key, ca = make_tls(tmp_path)
    leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    authority = x509.load_pem_x509_certificate(ca.read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    leaf.verify_directly_issued_by(authority)
    assert authority.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    assert private.public_key().public_bytes(
        serialization.Encoding.DER, public
    ) == leaf.public_key().public_bytes(serialization.Encoding.DER, public)


def _handshake(cert: Path, key: Path, ca: Path, hostname: str, *, strict: bool = False) -> None:
    """A TLS handshake in memory: server with cert/key, client trusting only `ca`."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(ca))
    if strict:
        client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done: set[str] = set()
    for _ in range(20):
        for name, side in (("client", client), ("server", server)):
            if name in done:
                continue
            try:
                side.do_handshake()
                done.add(name)
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == {"client", "server"}:
            return
    raise AssertionError("handshake did not complete")


@pytest.mark.parametrize("hostname", ["localhost", "127.0.0.1", "::1"])
def test_generated_pair_serves_tls_to_a_client_trusting_the_ca(tmp_path: Path, hostname: str) -> None:
    """A client trusting only ca.pem accepts the listener's cert for each local name."""
    cert, key, ca = make_tls(tmp_path)
    _handshake(cert, key, ca, hostname)


def test_generated_pair_is_not_valid_for_other_names(tmp_path: Path) -> None:
    """The cert does not vouch for a name it does not carry."""
    cert, key, ca = make_tls(tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(cert, key, ca, "example.com")


def test_generated_pair_passes_strict_verification(tmp_path: Path) -> None:
    """Clients with strict X.509 checks (Python 3.13+ defaults) accept the generated cert."""
    cert, key, ca = make_tls(tmp_path)
    _handshake(cert, key, ca, "localhost", strict=True)


def test_operator_tls_files_are_used_as_given(tmp_path: Path) -> None:
    """With TLS_CERT_FILE and TLS_KEY_FILE set nothing is generated and no CA is returned."""
    cert, key, _ca = make_tls(tmp_path / "operator")
    run_dir = tmp_path / "run"
    settings = Settings.from_env(
        {"RUN_DIR": str(run_dir), "TLS_CERT_FILE": str(cert), "TLS_KEY_FILE": str(key)}
    )
    assert bootstrap.ensure_tls_material(settings) == (cert, key, None)
    assert not (run_dir / "tls").exists()
