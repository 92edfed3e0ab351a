"""The reliability record: what each load, fault or soak test measured, one JSON file per test
in LAYERSERVE_RELIABILITY_OUT (default: layerserve-reliability in the system's temp dir).
`python -m tests.reliability.report DIR` renders docs/reliability.md from them."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

ENV = "LAYERSERVE_RELIABILITY_OUT"


def out_dir() -> Path:
    path = Path(os.environ.get(ENV) or Path(tempfile.gettempdir()) / "layerserve-reliability")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_record(name: str, title: str, data: dict[str, Any]) -> Path:
    """Writes one test's measurements as `<name>.json`. `data` holds the report's fields:
    load (what was sent), faults (list of what was injected), outcomes ({completed, errored,
    lost}), errors ({error: count}), rss_mib ({phase: {process: MiB}}), latency ({label: {...}}),
    notes (list of sentences); any may be absent."""
    record = {"name": name, "title": title, "finished_at": time.time(), **data}
    path = out_dir() / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
