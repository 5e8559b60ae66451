"""The Helm chart (envoy/helm/cordon/) and every manifest, against the Kubernetes schemas.

No cluster and no `helm` binary are needed: the chart is rendered by tests/support/minihelm.py
(the subset of Go templates the chart is written in) and, when `helm` is on PATH, also by `helm
template`, and the two must agree. Every rendered object, and every object of envoy/k8s/, is
validated against the Kubernetes OpenAPI schemas of the oldest version the manifests support
(strict: an unknown or misspelt field fails), with the schemas `kubernetes-validate` ships.
Then the renderings are read as the cluster would: ports, environment names, secrets, the Envoy
bootstrap each pod renders, and the NetworkPolicies.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.integration.test_deploy import (
    DNS,
    K8S,
    PYPROJECT,
    Doc,
    Endpoint,
    bootstrap_cli,
    cluster,
    command_option,
    extproc_endpoints,
    listener,
    port_numbers,
    rule_ports,
    selects,
    tls_files,
    unknown_names,
    worker_endpoints,
    worker_ports,
)
from tests.support.minihelm import TemplateError, manifests, render_chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "envoy" / "helm" / "cordon"
KUBERNETES = "1.29"  # native sidecars (restartPolicy: Always on init containers)
SECRET_ENV = ("ADMIN_TOKEN", "RECEIPT_SECRET", "TENANT_SECRET", "REDIS_URL")


# --- schema validation ----------------------------------------------------------------------------


def schema_errors(doc: Doc) -> list[str]:
    try:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{doc['kind']} {doc['metadata'].get('name')}: {exc.message} at {list(exc.path)}"]
    return []


def k8s_objects() -> list[Doc]:
    return [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def test_k8s_manifests_match_the_kubernetes_schemas() -> None:
    objects = k8s_objects()
    assert {doc["kind"] for doc in objects} >= {"Deployment", "StatefulSet", "Service", "NetworkPolicy"}
    assert [e for doc in objects for e in schema_errors(doc)] == []


@pytest.mark.parametrize(
    "path, value",
    [
        (["spec", "template", "spec", "containers", 0, "enviroment"], []),
        (["spec", "replicas"], "three"),
        (["spec", "template", "spec", "containers", 0, "ports", 0, "containerPort"], None),
    ],
    ids=["misspelt-field", "wrong-type", "null-required"],
)
def test_the_schema_check_catches_mistakes(path: list[Any], value: Any) -> None:
    """The check can fail: an unknown field, a wrong type, a required field without a value."""
    broken = next(doc for doc in k8s_objects() if doc["kind"] == "Deployment")
    target = broken
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert schema_errors(broken) != []


def test_kubernetes_validate_is_a_declared_test_dependency() -> None:
    test_extra = PYPROJECT["project"]["optional-dependencies"]["test"]
    assert any(re.match(r"kubernetes-validate\b", req) for req in test_extra)


# --- rendering ------------------------------------------------------------------------------------

# Value sets the tests render the chart with: the defaults, and each switch the values offer.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "sidecar": {"mode": "sidecar", "sidecar": {"agent": {"env": [{"name": "AGENT_MODE", "value": "x"}]}}},
    "external-redis": {
        "redis": {"deploy": False, "external": {"cidrs": ["10.20.0.15/32"]}},
        "tls": {"secretName": ""},
        "policies": {"create": False},
    },
    "locked-down": {
        "namespace": {"create": True},
        "admin": {"enabled": False},
        "gateway": {"replicas": 5, "pdb": {"enabled": False}},
        "image": {"repository": "registry.example.com/cordon", "tag": "0.1.0-1"},
        "upstreams": {"openai": "https://llm-proxy.internal:8443", "anthropic": "https://api.anthropic.com"},
        "networkPolicy": {
            "agentNamespaces": ["agents-a", "agents-b"],
            "gatewayFrom": [{"namespaceSelector": {"matchLabels": {"cordon.io/agents": "true"}}}],
            "upstreams": {"ports": [443, 8443]},
        },
    },
}


@functools.cache
def rendered(name: str) -> tuple[Doc, ...]:
    return tuple(manifests(render_chart(CHART, VALUE_SETS[name], namespace="cordon")))


def values(name: str) -> Doc:
    from tests.support.minihelm import merge

    return merge(yaml.safe_load((CHART / "values.yaml").read_text()), VALUE_SETS[name])


def objects_of(docs: tuple[Doc, ...], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def pod_spec(workload: Doc) -> Doc:
    return workload["spec"]["template"]["spec"]


def containers(pod: Doc) -> dict[str, Doc]:
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def env_of(item: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in item.get("env", [])}


def plain(item: Doc) -> dict[str, str]:
    return {n: e["value"] for n, e in env_of(item).items() if "value" in e}


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_chart_renders_objects_the_schemas_accept(name: str) -> None:
    docs = rendered(name)
    assert docs and [e for doc in docs for e in schema_errors(doc)] == []
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "an object rendered twice"
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"], doc["metadata"]["name"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "cordon"
    assert not objects_of(docs, "Secret"), "Secrets are created out of band"


def test_chart_metadata_follows_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "cordon"
    assert chart["appVersion"] == PYPROJECT["project"]["version"]
    images = {
        c["image"]
        for d in rendered("defaults")
        if "template" in d.get("spec", {})
        for c in containers(pod_spec(d)).values()
    }
    assert f"cordon-ext-proc:{PYPROJECT['project']['version']}" in images
    assert all(":" in image and not image.endswith(":latest") for image in images)


def test_chart_values_reach_the_objects() -> None:
    docs = rendered("locked-down")
    gateway = named(docs, "Deployment", "cordon-gateway")
    assert gateway["spec"]["replicas"] == 5
    assert {c["image"] for c in containers(pod_spec(gateway)).values()} == {
        "registry.example.com/cordon:0.1.0-1"
    }
    assert not objects_of(docs, "PodDisruptionBudget")
    assert {d["metadata"]["name"] for d in objects_of(docs, "Deployment")} == {"cordon-gateway"}  # no admin
    namespace = named(docs, "Namespace", "cordon")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert (
        plain(containers(pod_spec(gateway))["envoy"])["OPENAI_UPSTREAM"] == "https://llm-proxy.internal:8443"
    )

    defaults = rendered("defaults")
    assert named(defaults, "PodDisruptionBudget", "cordon-gateway")["spec"]["minAvailable"] == 2
    assert not objects_of(defaults, "Namespace")
    policies = named(defaults, "ConfigMap", "cordon-policies")["data"]
    assert policies == values("defaults")["policies"]["files"] and "default.yaml" in policies
    assert not [d for d in rendered("external-redis") if d["kind"] in ("ConfigMap", "StatefulSet")]


def test_chart_refuses_a_redis_it_cannot_let_through() -> None:
    """redis.deploy: false without the addresses of the Redis to use: the NetworkPolicies would
    shut the gateway out of its receipt store, so the chart does not render."""
    with pytest.raises(TemplateError, match=r"redis\.external\.cidrs"):
        render_chart(CHART, {"redis": {"deploy": False}})
    with pytest.raises(TemplateError, match=r"policies\.files"):
        render_chart(CHART, {"policies": {"files": None}})


# --- the pods, as the cluster would run them ------------------------------------------------------


def cordon_pods(docs: tuple[Doc, ...]) -> dict[str, Doc]:
    return {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "Deployment" and "ext-proc" in containers(pod_spec(d))
    }


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_chart_environment_names_and_secrets(name: str) -> None:
    """Every environment name ext_proc and Envoy get is one ext_proc/config.py reads; secrets
    and REDIS_URL come from secretKeyRef; ADMIN_TOKEN only in the admin pods, required there."""
    for workload, doc in cordon_pods(rendered(name)).items():
        for item in (containers(pod_spec(doc))["ext-proc"], containers(pod_spec(doc))["envoy"]):
            env = env_of(item)
            assert unknown_names(env) == set(), (workload, item["name"])
            for secret in SECRET_ENV:
                if secret in env:
                    assert "value" not in env[secret] and "secretKeyRef" in env[secret]["valueFrom"], secret
            assert ("ADMIN_TOKEN" in env) == (workload == "cordon-admin" and item["name"] == "ext-proc")
            if "ADMIN_TOKEN" in env:
                assert "optional" not in env["ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]


@pytest.mark.parametrize("name", ["defaults", "sidecar", "external-redis"])
def test_chart_envoy_renders_a_bootstrap_that_fits_its_pod(name: str, tmp_path: Path) -> None:
    """Each Envoy container renders its bootstrap with `python -m ext_proc bootstrap` from its
    environment, then runs it: the config listens on the container's ports, reaches every ext_proc
    worker on loopback where it listens (the pod's WORKERS, one port each, all container ports),
    buffers what ext_proc accepts, forwards to the configured upstreams and uses the mounted TLS
    pair (or a generated one when no Secret is named)."""
    docs = rendered(name)
    chart_values = values(name)
    for workload, doc in cordon_pods(docs).items():
        pod = pod_spec(doc)
        ext, envoy = containers(pod)["ext-proc"], containers(pod)["envoy"]
        env = plain(envoy)
        script = envoy["command"][2]
        output = command_option(envoy["command"], "--output")
        assert script.startswith("python -m ext_proc bootstrap --output")
        assert command_option(envoy["command"], "-c") == output
        assert output.startswith(env["RUN_DIR"] + "/")
        assert int(command_option(envoy["command"], "--concurrency")) >= int(plain(ext)["WORKERS"])
        run_dir = tmp_path / workload
        config = bootstrap_cli(env | {"RUN_DIR": str(run_dir)}, run_dir / "envoy.yaml")
        ports = port_numbers(envoy)
        assert listener(config, "plain") == Endpoint("0.0.0.0", ports["http"])
        assert listener(config, "tls") == Endpoint("0.0.0.0", ports["https"])
        assert env["WORKERS"] == plain(ext)["WORKERS"] and env["EXTPROC_PORT"] == plain(ext)["EXTPROC_PORT"]
        assert extproc_endpoints(config) == worker_endpoints(plain(ext))
        grpc = {("grpc-" + str(i) if i else "grpc"): port for i, port in enumerate(worker_ports(plain(ext)))}
        assert {n: p for n, p in port_numbers(ext).items() if n.startswith("grpc")} == grpc
        assert plain(ext)["MAX_BODY_BYTES"] == env["MAX_BODY_BYTES"] == chart_values["maxBodyBytes"]
        for provider in ("openai", "anthropic"):
            upstream = chart_values["upstreams"][provider]
            host = re.sub(r"^https?://", "", upstream).split(":")[0]
            assert (
                cluster(config, provider)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
                    "address"
                ]["socket_address"]["address"]
                == host
            )
        mounts = {m["mountPath"]: m["name"] for m in envoy["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts[env["RUN_DIR"]]]
        if chart_values["tls"]["secretName"]:
            assert (
                volumes[mounts["/etc/cordon/tls"]]["secret"]["secretName"]
                == chart_values["tls"]["secretName"]
            )
            assert {"/etc/cordon/tls/tls.crt", "/etc/cordon/tls/tls.key"} <= tls_files(config)
        else:
            assert "/etc/cordon/tls" not in mounts
            assert (run_dir / "tls" / "cert.pem").exists()
        ext_mounts = {m["mountPath"]: m["name"] for m in ext["volumeMounts"]}
        assert (
            volumes[ext_mounts[plain(ext)["POLICY_DIR"]]]["configMap"]["name"]
            == chart_values["policies"]["name"]
        )
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert ext[probe]["grpc"]["port"] == port_numbers(ext)["grpc"]
            assert envoy[probe]["httpGet"]["port"] == "http"
        assert envoy["readinessProbe"]["httpGet"]["path"] == chart_values["envoyReadinessPath"]
        for item in (ext, envoy):
            assert item["securityContext"]["runAsUser"] == 10001
            assert item["securityContext"]["readOnlyRootFilesystem"] is True


def test_chart_sidecar_pod() -> None:
    docs = rendered("sidecar")
    agent = named(docs, "Deployment", "agent")
    pod = pod_spec(agent)
    assert [c["name"] for c in pod["initContainers"]] == ["ext-proc", "envoy"]
    assert all(c["restartPolicy"] == "Always" for c in pod["initContainers"])
    port = port_numbers(containers(pod)["envoy"])["http"]
    env = plain(containers(pod)["agent"])
    assert env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/v1" and env["AGENT_MODE"] == "x"
    assert not [d for d in docs if d["metadata"]["name"] in ("cordon-gateway", "cordon-admin")]


def test_chart_services_reach_their_pods() -> None:
    docs = rendered("defaults")
    for service in objects_of(docs, "Service"):
        targets = [
            d
            for d in docs
            if d["kind"] in ("Deployment", "StatefulSet")
            and selects(
                {"matchLabels": service["spec"]["selector"]}, d["spec"]["template"]["metadata"]["labels"]
            )
        ]
        assert len(targets) == 1, service["metadata"]["name"]
        names = {n for c in containers(pod_spec(targets[0])).values() for n in port_numbers(c)}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
    admin = named(docs, "Service", "cordon-admin")
    assert [(p["port"], p["targetPort"]) for p in admin["spec"]["ports"]] == [
        (values("defaults")["admin"]["servicePort"], "https")
    ]


# --- the NetworkPolicies --------------------------------------------------------------------------


def egress(policy: Doc) -> dict[frozenset[tuple[str, int]], list[Doc]]:
    assert "Egress" in policy["spec"]["policyTypes"], policy["metadata"]["name"]
    return {frozenset(rule_ports(rule)): rule["to"] for rule in policy["spec"]["egress"]}


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_chart_every_pod_is_held_by_an_egress_policy(name: str) -> None:
    docs = rendered(name)
    policies = objects_of(docs, "NetworkPolicy")
    for workload in (d for d in docs if d["kind"] in ("Deployment", "StatefulSet")):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        holding = [
            p
            for p in policies
            if p["metadata"]["namespace"] == workload["metadata"]["namespace"]
            and selects(p["spec"]["podSelector"], labels)
            and "Egress" in p["spec"]["policyTypes"]
        ]
        assert holding, workload["metadata"]["name"]
        for policy in holding:
            grpc = {
                ("TCP", p)
                for c in containers(pod_spec(workload)).values()
                for n, p in port_numbers(c).items()
                if n.startswith("grpc")
            }
            for rule in policy["spec"].get("ingress", []):
                assert not rule_ports(rule) & grpc, "ext_proc's gRPC port serves its own pod only"


def test_chart_gateway_egress_is_dns_the_providers_and_redis() -> None:
    for name in VALUE_SETS:
        docs = rendered(name)
        chart_values = values(name)
        https = frozenset(("TCP", p) for p in chart_values["networkPolicy"]["upstreams"]["ports"])
        redis = frozenset({("TCP", chart_values["redis"]["port"])})
        holder = "cordon-gateway" if chart_values["mode"] == "gateway" else "agent-cordon"
        rules = egress(named(docs, "NetworkPolicy", holder))
        assert set(rules) == {frozenset(DNS), https, redis}, name
        assert all(set(peer) == {"ipBlock"} for peer in rules[https])
        assert [p["ipBlock"] for p in rules[https]] == chart_values["networkPolicy"]["upstreams"]["ipBlocks"]
        if chart_values["redis"]["deploy"]:
            stateful = named(docs, "StatefulSet", "cordon-redis")
            assert all(
                selects(p["podSelector"], stateful["spec"]["template"]["metadata"]["labels"])
                for p in rules[redis]
            )
        else:
            assert [p["ipBlock"]["cidr"] for p in rules[redis]] == chart_values["redis"]["external"]["cidrs"]
        if chart_values["mode"] == "gateway" and chart_values["admin"]["enabled"]:
            admin = egress(named(docs, "NetworkPolicy", "cordon-admin"))
            assert set(admin) == {frozenset(DNS), redis}, "the admin pods never reach a provider"


def test_chart_agents_reach_the_gateway_only() -> None:
    docs = rendered("locked-down")
    gateway = named(docs, "Deployment", "cordon-gateway")
    listeners = frozenset(("TCP", p) for p in port_numbers(containers(pod_spec(gateway))["envoy"]).values())
    agent_policies = [
        d for d in objects_of(docs, "NetworkPolicy") if d["metadata"]["name"] == "cordon-agent-egress"
    ]
    assert sorted(p["metadata"]["namespace"] for p in agent_policies) == ["agents-a", "agents-b"]
    for policy in agent_policies:
        assert policy["spec"]["policyTypes"] == ["Egress"]
        assert policy["spec"]["podSelector"]["matchLabels"] == {"cordon.io/egress": "gateway"}
        rules = egress(policy)
        assert set(rules) == {frozenset(DNS), listeners}
        for peer in rules[listeners]:
            assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "cordon"}
            assert selects(peer["podSelector"], gateway["spec"]["template"]["metadata"]["labels"])
    ingress = named(docs, "NetworkPolicy", "cordon-gateway")["spec"]["ingress"]
    assert ingress[0]["from"] == VALUE_SETS["locked-down"]["networkPolicy"]["gatewayFrom"]
    assert "from" not in ingress[1]  # metrics


def test_chart_redis_is_reached_by_cordon_only() -> None:
    for name in ("defaults", "sidecar"):
        docs = rendered(name)
        policy = named(docs, "NetworkPolicy", "cordon-redis")
        assert policy["spec"]["egress"] == []
        peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
        let_in = {
            d["metadata"]["name"]
            for d in docs
            if d["kind"] in ("Deployment", "StatefulSet")
            for peer in peers
            if selects(peer["podSelector"], d["spec"]["template"]["metadata"]["labels"])
        }
        assert let_in == set(cordon_pods(docs)), name
        redis = containers(pod_spec(named(docs, "StatefulSet", "cordon-redis")))["redis"]
        auth = values(name)["redis"]["auth"]
        for var in ("REDIS_PASSWORD", "REDISCLI_AUTH"):
            assert env_of(redis)[var]["valueFrom"]["secretKeyRef"] == {
                "name": auth["secretName"],
                "key": auth["secretKey"],
            }
        assert "--requirepass" in redis["args"] and redis["args"][-2:] == ["--maxmemory-policy", "noeviction"]


# --- the renderer itself, and Helm when there is one ----------------------------------------------


def test_renderer_subset(tmp_path: Path) -> None:
    chart = tmp_path / "c"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 1.0.0\nappVersion: '2'\n")
    (chart / "values.yaml").write_text("a: {b: [x, y]}\nbig: 33554432\nflag: false\n")
    (chart / "templates" / "_h.tpl").write_text('{{- define "h" -}}\nk: {{ .v | quote }}\n{{- end }}')
    (chart / "templates" / "t.yaml").write_text(
        "l:\n{{- range $i, $v := .Values.a.b }}\n  - {{ $i }}={{ $v }}\n{{- end }}\n"
        "{{- if .Values.flag }}\nno: 1\n"
        "{{- else if not .Values.flag }}\nok: {{ .Chart.AppVersion }}\n{{- end }}\n"
        '{{- include "h" (dict "v" .Release.Name) | nindent 0 }}\n'
    )
    assert yaml.safe_load(render_chart(chart)["t.yaml"]) == {"l": ["0=x", "1=y"], "ok": 2, "k": "cordon"}
    (chart / "templates" / "t.yaml").write_text("n: {{ .Values.big }}\n")
    with pytest.raises(TemplateError, match="float"):
        render_chart(chart)  # Helm would print 3.3554432e+07
    (chart / "templates" / "t.yaml").write_text("n: {{ .Values.a | upper }}\n")
    with pytest.raises(TemplateError, match="outside the subset"):
        render_chart(chart)
    (chart / "templates" / "t.yaml").write_text("n: {{ .Values.none.deeper }}\n")
    with pytest.raises(TemplateError, match="nil pointer"):
        render_chart(chart)


@pytest.mark.skipif(shutil.which("helm") is None, reason="no helm binary on PATH")
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_renders_the_same(name: str, tmp_path: Path) -> None:
    """With `helm` present, `helm template` gives the same objects as the renderer."""
    overrides = tmp_path / "values.yaml"
    overrides.write_text(yaml.safe_dump(VALUE_SETS[name]))
    out = subprocess.run(
        ["helm", "template", "cordon", str(CHART), "--namespace", "cordon", "-f", str(overrides)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    theirs = sorted((d for d in yaml.safe_load_all(out) if d), key=_key)
    assert theirs == sorted(rendered(name), key=_key)


def _key(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
