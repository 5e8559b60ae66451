"""Settings from the environment, read once when a command starts, never at import time.

The names are an interface: operators, tests and deployment manifests depend on them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ext_proc.errors import CordonError

DEFAULT_REDIS_PORT = 6390


class ConfigError(CordonError, ValueError):
    """A setting has a value that cannot work; the message names the setting, not a secret."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where Envoy sends one provider's traffic."""

    name: str
    url: str
    scheme: str
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


def parse_upstream(name: str, url: str) -> Upstream:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name.upper()}_UPSTREAM must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{name.upper()}_UPSTREAM must not carry credentials; clients send their own keys")
    if parts.path not in ("", "/") or parts.query:
        raise ConfigError(f"{name.upper()}_UPSTREAM must not carry a path or query")
    try:
        explicit = parts.port
    except ValueError:
        raise ConfigError(
            f"{name.upper()}_UPSTREAM has a port that is not a number from 1 to 65535"
        ) from None
    if explicit == 0:
        raise ConfigError(f"{name.upper()}_UPSTREAM has port 0")
    port = explicit if explicit is not None else (443 if parts.scheme == "https" else 80)
    return Upstream(name=name, url=url, scheme=parts.scheme, host=parts.hostname, port=port)


def _int(env: Mapping[str, str], name: str, default: int, *, low: int = 0, high: int = 2**31) -> int:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} and {high}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false")


def _optional_days(env: Mapping[str, str], name: str) -> float | None:
    """A number of days (decimals allowed, more than 0), or None when unset."""
    raw = env.get(name, "").strip()
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of days") from None
    if not 0 < value <= 36500:
        raise ConfigError(f"{name} must be more than 0 and at most 36500 days")
    return value


def _optional_port(env: Mapping[str, str], name: str) -> int | None:
    if env.get(name, "") == "":
        return None
    return _int(env, name, 0, low=1, high=65535)


def _optional_path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    return Path(raw) if raw else None


def _redis_url(raw: str) -> str | None:
    """REDIS_URL, checked now: a URL no client can use stops the command at once, naming the
    variable and what is wrong (never the URL, which may hold a password), instead of every
    worker failing on it and being restarted."""
    from ext_proc.storage.redis_url import RedisUrlError, check_url

    url = raw.strip() or None
    if url is not None:
        try:
            check_url(url)
        except RedisUrlError as exc:
            raise ConfigError(str(exc)) from None
    return url


MIN_SECRET_CHARS = 32
MIN_ADMIN_TOKEN_CHARS = 16


def _secret(env: Mapping[str, str], name: str, min_chars: int) -> str | None:
    """A secret without surrounding whitespace (a Secret mounted as a file ends with a newline
    that one replica may have and another not), long and varied enough not to be guessed."""
    raw = env.get(name, "").strip()
    if raw == "":
        return None
    if len(raw) < min_chars or len(set(raw)) < 8:
        # Never echo it: a length and a rule only.
        raise ConfigError(f"{name} is too weak: use at least {min_chars} random characters")
    return raw


@dataclass(frozen=True, slots=True)
class Settings:
    listen_address: str
    listen_port: int
    tls_port: int
    envoy_admin_port: int
    extproc_address: str
    extproc_port: int
    metrics_port: int
    workers: int
    redis_url: str | None  # None: the stack starts an embedded Redis on 127.0.0.1:6390
    policy_dir: Path
    openai_upstream: Upstream | None  # None: the bundled fake upstream
    anthropic_upstream: Upstream | None
    admin_token: str | None
    tenant_secret: str | None  # None: consistent pseudonyms refused (policy load names the file)
    trust_tenant_header: bool
    max_body_bytes: int
    run_dir: Path
    tls_cert_file: Path | None
    tls_key_file: Path | None
    upstream_ca_file: Path
    fake_upstream_port: int
    log_level: str
    message_timeout_seconds: int
    redis_timeout_ms: int
    ocr_workers: int
    ocr_budget_seconds: int
    ocr_max_images: int
    receipt_check_seconds: int  # how often a worker rechecks the chains it appended to
    receipt_retention_days: float | None  # None: keep every record
    receipt_secret: str | None  # None: generated once under RUN_DIR (one host only)
    bench_listen_port: int | None = None  # `make bench` only: a listener without the filter
    # `make bench` only: listeners whose ext_proc filter talks to a pass-through server at
    # bench_floor_extproc_port, exchanging 2 (no bodies) or 4 (bodies buffered) messages.
    bench_floor2_port: int | None = None
    bench_floor4_port: int | None = None
    bench_floor_extproc_port: int | None = None
    envoy_access_log: Path | None = None  # None: RUN_DIR/logs/envoy-access.log

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        openai = env.get("OPENAI_UPSTREAM", "").strip()
        anthropic = env.get("ANTHROPIC_UPSTREAM", "").strip()
        cert = env.get("TLS_CERT_FILE", "").strip()
        key = env.get("TLS_KEY_FILE", "").strip()
        if bool(cert) != bool(key):
            raise ConfigError("TLS_CERT_FILE and TLS_KEY_FILE must be set together")
        # A floor listener without its server would answer every request 500.
        floors = env.get("BENCH_FLOOR2_PORT", "") or env.get("BENCH_FLOOR4_PORT", "")
        if floors and not env.get("BENCH_FLOOR_EXTPROC_PORT", ""):
            raise ConfigError("BENCH_FLOOR2_PORT and BENCH_FLOOR4_PORT need BENCH_FLOOR_EXTPROC_PORT")
        settings = cls(
            listen_address=env.get("LISTEN_ADDRESS", "127.0.0.1"),
            listen_port=_int(env, "LISTEN_PORT", 10000, low=1, high=65535),
            tls_port=_int(env, "TLS_PORT", 10443, low=1, high=65535),
            envoy_admin_port=_int(env, "ENVOY_ADMIN_PORT", 9901, low=1, high=65535),
            extproc_address=env.get("EXTPROC_ADDRESS", "127.0.0.1"),
            extproc_port=_int(env, "EXTPROC_PORT", 50051, low=1, high=65535),
            metrics_port=_int(env, "METRICS_PORT", 9464, low=1, high=65535),
            workers=_int(env, "WORKERS", os.cpu_count() or 1, low=1, high=256),
            redis_url=_redis_url(env.get("REDIS_URL", "")),
            policy_dir=Path(env.get("POLICY_DIR", "policies")),
            openai_upstream=parse_upstream("openai", openai) if openai else None,
            anthropic_upstream=parse_upstream("anthropic", anthropic) if anthropic else None,
            admin_token=_secret(env, "ADMIN_TOKEN", MIN_ADMIN_TOKEN_CHARS),
            tenant_secret=_secret(env, "TENANT_SECRET", MIN_SECRET_CHARS),
            trust_tenant_header=_bool(env, "TRUST_TENANT_HEADER", False),
            max_body_bytes=_int(env, "MAX_BODY_BYTES", 33554432, low=1024, high=2**30),
            run_dir=Path(env.get("RUN_DIR", ".run")),
            tls_cert_file=Path(cert) if cert else None,
            tls_key_file=Path(key) if key else None,
            upstream_ca_file=Path(env.get("UPSTREAM_CA_FILE", "/etc/ssl/certs/ca-certificates.crt")),
            fake_upstream_port=_int(env, "FAKE_UPSTREAM_PORT", 18080, low=1, high=65535),
            log_level=env.get("LOG_LEVEL", "INFO").upper(),
            message_timeout_seconds=_int(env, "EXTPROC_MESSAGE_TIMEOUT", 60, low=1, high=300),
            redis_timeout_ms=_int(env, "REDIS_TIMEOUT_MS", 250, low=10, high=60000),
            ocr_workers=_int(env, "OCR_WORKERS", 1, low=1, high=64),
            ocr_budget_seconds=_int(env, "OCR_BUDGET_SECONDS", 30, low=1, high=280),
            ocr_max_images=_int(env, "OCR_MAX_IMAGES", 16, low=1, high=256),
            receipt_check_seconds=_int(env, "RECEIPT_CHECK_SECONDS", 60, low=1, high=86400),
            receipt_retention_days=_optional_days(env, "RECEIPT_RETENTION_DAYS"),
            receipt_secret=_secret(env, "RECEIPT_SECRET", MIN_SECRET_CHARS),
            bench_listen_port=_optional_port(env, "BENCH_LISTEN_PORT"),
            bench_floor2_port=_optional_port(env, "BENCH_FLOOR2_PORT"),
            bench_floor4_port=_optional_port(env, "BENCH_FLOOR4_PORT"),
            bench_floor_extproc_port=_optional_port(env, "BENCH_FLOOR_EXTPROC_PORT"),
            envoy_access_log=_optional_path(env, "ENVOY_ACCESS_LOG"),
        )
        settings.check_extproc_ports()
        return settings

    @property
    def extproc_ports(self) -> range:
        """Worker i's gRPC port is EXTPROC_PORT + i; Envoy's ext_proc cluster lists them all."""
        return range(self.extproc_port, self.extproc_port + self.workers)

    def check_extproc_ports(self) -> None:
        last = self.extproc_ports[-1]
        if last > 65535:
            raise ConfigError(f"EXTPROC_PORT + WORKERS - 1 is {last}: the workers' ports must end by 65535")
        if self.metrics_port in self.extproc_ports:
            raise ConfigError(
                f"METRICS_PORT {self.metrics_port} is one of the workers' ports "
                f"(EXTPROC_PORT {self.extproc_port} to {last}, one per worker)"
            )

    @property
    def effective_redis_url(self) -> str:
        return self.redis_url or f"redis://127.0.0.1:{DEFAULT_REDIS_PORT}/0"

    @property
    def access_log_path(self) -> Path:
        """Envoy's access log (JSON lines): ENVOY_ACCESS_LOG, else under RUN_DIR/logs."""
        if self.envoy_access_log is not None:
            return self.envoy_access_log
        return (self.run_dir / "logs" / "envoy-access.log").absolute()

    @property
    def redis_timeout(self) -> float:
        return self.redis_timeout_ms / 1000

    @property
    def receipt_secret_file(self) -> Path:
        return self.run_dir / "receipt.secret"

    def load_receipt_secret(self, *, create: bool = False) -> bytes:
        """The HMAC key of `refDigest`: RECEIPT_SECRET, else a random one kept in RUN_DIR (0600).

        Every worker and replica that answers the admin query must share it, so a deployment with
        several replicas sets RECEIPT_SECRET; the generated file only serves one host. Never kept
        in Redis: with the key next to the digests, a guessable ref could be found by trying.
        """
        if self.receipt_secret is not None:
            return self.receipt_secret.encode("utf-8")
        path = self.receipt_secret_file
        if create and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as out:
                    out.write(secrets.token_hex(32))
        try:
            value = path.read_text().strip()
        except OSError:
            raise ConfigError(
                f"RECEIPT_SECRET is unset and {path} cannot be read; set RECEIPT_SECRET"
            ) from None
        if len(value) < MIN_SECRET_CHARS:
            raise ConfigError(
                f"{path} does not hold a usable receipt secret; delete it or set RECEIPT_SECRET"
            )
        return value.encode("utf-8")

    @property
    def grpc_message_limit(self) -> int:
        # A body travels inside one gRPC message, with its headers and framing.
        return self.max_body_bytes + 1024 * 1024
