"""Reading a /metrics page in tests: Prometheus' text format, parsed by prometheus_client's own
parser, summed over the series that match. Metrics are process-wide counters, so tests compare
a page read before with one read after, never absolute values."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    """One /metrics page: every sample, keyed by (sample name, its labels)."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    types: dict[str, str]  # family name -> counter, gauge, histogram, ...

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples, types = {}, {}
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return cls(samples, types)

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` whose labels include `labels` (0 if none)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(ls)[label] for (n, ls) in self.samples if n == name and label in dict(ls)}

    def delta(self, before: Scrape, name: str, **labels: str) -> float:
        return self.value(name, **labels) - before.value(name, **labels)
