"""The local stack's Envoy bootstrap: TLS material made once under RUN_DIR/tls (unless the operator
gave TLS_CERT_FILE/TLS_KEY_FILE) and the rendered file RUN_DIR/envoy.yaml.

Rendering imports the route and provider tables (and with them much of the filter) and, the first
time, `cryptography` for the self-signed pair. `stack run` lives as long as the stack and needs
neither afterwards, so it runs `python -m ext_proc.runtime.envoy_config` as a short-lived child,
which reads the same environment; a process that holds those modules anyway calls
`write_envoy_config` itself.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from ext_proc.runtime.config import Settings, parse_upstream


def config_path(settings: Settings) -> Path:
    return settings.run_dir / "envoy.yaml"


def write_envoy_config(settings: Settings) -> Path:
    """Render Envoy's bootstrap for `settings` into RUN_DIR/envoy.yaml; unset upstreams are the
    bundled fake upstream on FAKE_UPSTREAM_PORT."""
    from ext_proc.runtime import bootstrap

    s = settings
    fake_url = f"http://127.0.0.1:{s.fake_upstream_port}"
    cert, key, _ = bootstrap.ensure_tls_material(s)
    config = bootstrap.render(
        s,
        openai=s.openai_upstream or parse_upstream("openai", fake_url),
        anthropic=s.anthropic_upstream or parse_upstream("anthropic", fake_url),
        cert=cert.resolve(),
        key=key.resolve(),
    )
    path = config_path(s)
    path.write_text(config)
    return path


def main() -> int:
    from ext_proc.runtime import logs

    logs.setup()
    # A terminal's Ctrl-C reaches the whole process group: the parent decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    write_envoy_config(Settings.from_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
