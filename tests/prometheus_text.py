"""Reading a /metrics page in tests: Prometheus' text format or OpenMetrics, parsed by
prometheus_client's own parsers (keyed by sample name, as Prometheus stores them), summed over
the series that match. Metrics are process-wide counters, so tests compare
a page read before with one read after, never absolute values."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar

OPENMETRICS = "application/openmetrics-text; version=1.0.0"  # an Accept header asking for it


@dataclass(frozen=True)
class Scrape:
    """One /metrics page: every sample, keyed by (sample name, its labels)."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    types: dict[str, str]  # family name -> counter, gauge, histogram, ...
    exemplars: dict[tuple[str, frozenset[tuple[str, str]]], Exemplar] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, openmetrics: bool = False) -> Scrape:
        """`openmetrics`: the page is OpenMetrics (what Prometheus asks for first)."""
        parse = openmetrics_families if openmetrics else text_string_to_metric_families
        samples, types, exemplars = {}, {}, {}
        for family in parse(text):
            types[family.name] = family.type
            for sample in family.samples:
                key = (sample.name, frozenset(sample.labels.items()))
                samples[key] = sample.value
                if sample.exemplar is not None:
                    exemplars[key] = sample.exemplar
        return cls(samples, types, exemplars)

    @property
    def names(self) -> set[str]:
        """Every sample name on the page: what Prometheus would store."""
        return {name for name, _ in self.samples}

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` whose labels include `labels` (0 if none)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(ls)[label] for (n, ls) in self.samples if n == name and label in dict(ls)}

    def delta(self, before: Scrape, name: str, **labels: str) -> float:
        return self.value(name, **labels) - before.value(name, **labels)
