"""Running the filter: settings from the environment, Envoy's bootstrap and TLS material, and the
local stack behind `make run` / `make up`.
"""
