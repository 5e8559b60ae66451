"""What a detector reports: a kind and a span of the text it read. Never the text itself.

Detectors (the catalog, later the declared subjects) produce `Finding`s; redaction turns them into
placeholders; receipts and logs only ever see the kind.
"""

from __future__ import annotations

from dataclasses import dataclass

# Catalog kinds, by the set a policy turns on (docs/catalog.md).
SETS: dict[str, tuple[str, ...]] = {
    "pii": ("EMAIL", "PHONE", "SSN", "IP", "IBAN"),
    "pci": ("CREDIT_CARD",),
    "secrets": (
        "AWS_ACCESS_KEY",
        "PRIVATE_KEY",
        "JWT",
        "OPENAI_KEY",
        "ANTHROPIC_KEY",
        "GITHUB_TOKEN",
        "SLACK_TOKEN",
        "STRIPE_KEY",
        "GOOGLE_API_KEY",
        "API_TOKEN",
        "SECRET_ASSIGNMENT",
        "HIGH_ENTROPY",
    ),
}
ALL_SETS: tuple[str, ...] = tuple(SETS)
CATALOG_KINDS: tuple[str, ...] = tuple(k for kinds in SETS.values() for k in kinds)


@dataclass(frozen=True, slots=True)
class Finding:
    """A detected span `text[start:end]` of one kind.

    `label` is the kind as it appears in a placeholder: the catalog kind (`EMAIL`) or, for a
    declared subject, `SUBJECT{n}_{KIND}`. `priority` breaks ties between overlapping findings of
    equal length: lower wins (subjects < catalog order).
    """

    kind: str
    start: int
    end: int
    label: str = ""
    priority: int = 100

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.kind)

    @property
    def length(self) -> int:
        return self.end - self.start
