"""The metric names operators depend on, read from where they use them: every query of the
Grafana dashboards (observability/grafana/dashboards/*.json), the series the workers'
autoscaler reads (the prometheus-adapter rule of docs/deploy.md, whose external metric the HPA
in deploy/k8s names) and the README's Metrics table. Tests check them against what the
services' /metrics pages really hold, sample by sample, as Prometheus stores them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = REPO / "observability" / "grafana" / "dashboards"
METRIC = re.compile(r"layerserve:[A-Za-z0-9_:]+")


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    legend: str
    expr: str

    def promql(self, rate_interval: str) -> str:
        """The expression as Prometheus evaluates it once Grafana has filled in its variables."""
        return self.expr.replace("$__rate_interval", rate_interval)

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.legend}: {self.expr}"


def dashboard_queries() -> list[Query]:
    queries = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                legend = target.get("legendFormat", "")
                queries.append(Query(path.name, panel["title"], legend, target["expr"]))
    return queries


def dashboard_names() -> set[str]:
    return {name for query in dashboard_queries() for name in METRIC.findall(query.expr)}


def autoscaler_names() -> set[str]:
    """The series of the prometheus-adapter rules (docs/deploy.md) that serve an external
    metric an HPA of deploy/k8s scales on; every such external metric has a rule."""
    rules = _adapter_rules()
    wanted = set()
    for path in sorted((REPO / "deploy" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "HorizontalPodAutoscaler":
                continue
            for metric in doc["spec"].get("metrics", []):
                if metric["type"] == "External":
                    name = metric["external"]["metric"]["name"]
                    assert name in rules, f"{path.name}: no prometheus-adapter rule for {name}"
                    wanted.add(rules[name])
    return wanted


def _adapter_rules() -> dict[str, str]:
    """External metric name -> the series its rule queries."""
    text = (REPO / "docs" / "deploy.md").read_text()
    block = re.search(r"```yaml\n(\s*rules:.*?)```", text, re.S)
    assert block, "docs/deploy.md has no prometheus-adapter rules"
    rules = yaml.safe_load(_dedent(block.group(1)))["rules"]["external"]
    return {rule["name"]["as"]: METRIC.match(rule["seriesQuery"]).group() for rule in rules}


def _dedent(text: str) -> str:
    lines = text.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def readme_names() -> dict[str, str]:
    """Metric name -> its type, from the README's Metrics table (one row per metric)."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(layerserve:[A-Za-z0-9_:]+)` \| (\w+) \|", section, re.M)
    assert rows, "README's Metrics table lists no metric"
    return dict(rows)


def sample_names(name: str, kind: str) -> set[str]:
    """The sample names every family of that type writes (a histogram of a signed quantity
    has neither _sum nor, in OpenMetrics, _count: only its buckets)."""
    return {name + "_bucket"} if kind == "histogram" else {name}
