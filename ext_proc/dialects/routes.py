"""Envoy's upstream routes and what each means: the provider it leads to and the prefix it strips.

Envoy tells the processor the name of the route it chose (`xds.route_name`), so a request is
classified by the route Envoy actually took (ext_proc.dialects.classify) instead of a second copy
of the routing table. The bootstrap (ext_proc.runtime.bootstrap) renders these routes into
Envoy's configuration; this table is the one list of their names.
"""

from __future__ import annotations

from ext_proc.dialects.providers import ANTHROPIC, OPENAI, Provider

# route name -> (provider, path prefix Envoy strips before forwarding)
ROUTE_PROVIDERS: dict[str, tuple[Provider, str]] = {
    "openai": (OPENAI, ""),
    "anthropic": (ANTHROPIC, ""),
    "openai-prefixed": (OPENAI, "/openai"),
    "anthropic-prefixed": (ANTHROPIC, "/anthropic"),
    "openai-authority": (OPENAI, ""),
    "anthropic-authority": (ANTHROPIC, ""),
}
