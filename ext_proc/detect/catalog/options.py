"""The switches of one catalog that its validators read.

A policy chooses them (`Catalog.for_sets`); every validator receives them with each match. They
sit in a module of their own because validators in several modules and the engine all depend on
them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Options:
    """Per-catalog switches that validators read."""

    skip_documentation_ips: bool = False
