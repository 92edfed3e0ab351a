"""A pytest plugin (`-p benchmarks.gpu_stub_plugin`) for the GPU check: loaded before any
conftest, it stands in for packages the kernel tests import but never call (gguf, numpy,
prometheus_client, ...) where they are not installed; see gpu_imports.py."""

from __future__ import annotations

from benchmarks.gpu_imports import stub_missing

STUBBED = stub_missing()
