"""`docker compose up` would start a working stack: docker-compose.yml and its CPU variant
resolve in Docker Compose itself (tests/unit/compose_files.py), every service accepts the
configuration it is given and finds the others, and the images (docker/Dockerfile*) copy files
that exist, install as the Makefile does (the C++ CPU attention included, built where the
installed package finds it) and run modules that exist. No Docker engine needed."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.unit.compose_files import (
    CPU_FILES,
    GPU_FILES,
    LAYERSERVE_SERVICES,
    REPO,
    module_of,
    resolve,
    service_config,
)

SERVICES = {*LAYERSERVE_SERVICES, "internal-token", "redis", "jaeger", "prometheus", "grafana"}
SERVICES.add("worker-embedding")  # all-MiniLM-L6-v2 beside the chat model (issue 30)
MINILM = ("all-minilm-l6-v2", "/opt/venv/models/all-minilm-l6-v2")
TOKEN_DIR = "/var/lib/layerserve/secrets"
DOCKERFILES = ("docker/Dockerfile", "docker/Dockerfile.cuda")
GPU_RESERVATION = {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}


@pytest.fixture(scope="module")
def gpu(tmp_path_factory) -> dict:
    return resolve(tmp_path_factory.mktemp("gpu"), GPU_FILES)


@pytest.fixture(scope="module")
def cpu(tmp_path_factory) -> dict:
    return resolve(tmp_path_factory.mktemp("cpu"), CPU_FILES)


def test_both_variants_resolve_with_every_service(gpu, cpu) -> None:
    assert set(gpu["services"]) == SERVICES
    assert set(cpu["services"]) == SERVICES


def test_gpu_worker_reserves_one_nvidia_gpu_on_the_cuda_image(gpu) -> None:
    worker = gpu["services"]["worker"]
    assert worker["deploy"]["resources"]["reservations"]["devices"] == [GPU_RESERVATION]
    assert worker["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert service_config(gpu, "worker").device == "cuda"


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_the_worker_computes_in_its_devices_dtype(variant, request) -> None:
    """auto (dtype_choice.py): bfloat16 on a GPU, float32 on a CPU without bfloat16 dot
    products; not float32 forced on every device."""
    assert service_config(request.getfixturevalue(variant), "worker").dtype == "auto"


def test_cpu_variant_runs_the_worker_on_the_cpu_image_without_a_gpu(gpu, cpu) -> None:
    worker = cpu["services"]["worker"]
    assert not (worker.get("deploy") or {}).get("resources")
    assert worker["build"]["dockerfile"] == "docker/Dockerfile"
    assert worker["image"] != gpu["services"]["worker"]["image"]
    assert service_config(cpu, "worker").device == "cpu"
    # Nothing else changes.
    for name in SERVICES - {"worker"}:
        assert cpu["services"][name] == gpu["services"][name], name


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_the_embedding_worker_serves_minilm_from_the_image_on_the_cpu(variant, request) -> None:
    compose = request.getfixturevalue(variant)
    worker = service_config(compose, "worker-embedding", "worker")
    assert (worker.model_name, worker.model_path) == MINILM
    assert (worker.device, worker.dtype, worker.host) == ("cpu", "float32", "0.0.0.0")
    service = compose["services"]["worker-embedding"]
    assert service["image"] == "layerserve:cpu" and not service.get("deploy")
    assert service["healthcheck"]["test"][4] == f"127.0.0.1:{worker.port}"
    assert service["environment"]["LAYERSERVE_INTERNAL_TOKEN_FILE"] == f"{TOKEN_DIR}/internal-token"
    # The images link the checkpoint there (docker/Dockerfile*), as `make install` does.
    for dockerfile in DOCKERFILES:
        runs = [" ".join(args) for args in _instructions(dockerfile, "RUN")]
        link = (
            "python -m services.worker.model.packaged all-minilm-l6-v2 --cache-dir /opt/venv/models"
        )
        assert link in runs, dockerfile
    # The stack is not healthy, so not served, before the encoder is.
    depends = compose["services"]["scheduler"]["depends_on"]["worker-embedding"]
    assert depends["condition"] == "service_healthy"


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_each_service_starts_once_the_one_it_calls_is_healthy(variant, request) -> None:
    services = request.getfixturevalue(variant)["services"]
    for name, callee in [
        ("scheduler", "worker"),
        ("tokenizer", "scheduler"),
        ("gateway", "tokenizer"),
    ]:
        assert services[name]["depends_on"][callee]["condition"] == "service_healthy", name
    for name in ("scheduler", "gateway"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name
    assert "healthcheck" in services["redis"]


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_services_accept_their_configuration_and_find_each_other(variant, request) -> None:
    compose = request.getfixturevalue(variant)
    c = {name: service_config(compose, name) for name in LAYERSERVE_SERVICES}
    # Reachable from the other containers, not only on the container's loopback.
    assert {c[name].host for name in LAYERSERVE_SERVICES} == {"0.0.0.0"}
    embedding = service_config(compose, "worker-embedding", "worker")
    assert c["scheduler"].workers == (
        f"worker:{c['worker'].port}",
        f"worker-embedding:{embedding.port}",
    )
    assert c["tokenizer"].scheduler == f"scheduler:{c['scheduler'].port}"
    assert c["gateway"].tokenizer == f"tokenizer:{c['tokenizer'].port}"
    assert c["scheduler"].redis_url == c["gateway"].redis_url == "redis://redis:6379/0"
    gateway_ports = {p["target"] for p in compose["services"]["gateway"]["ports"]}
    assert gateway_ports == {c["gateway"].http_port, c["gateway"].grpc_port}


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_health_checks_ask_each_services_own_grpc_port(variant, request) -> None:
    compose = request.getfixturevalue(variant)
    for name in LAYERSERVE_SERVICES:
        config = service_config(compose, name)
        port = config.grpc_port if name == "gateway" else config.port
        test = compose["services"][name]["healthcheck"]["test"]
        assert test[0] == "CMD", name
        assert module_of(test[1:]) == "services.common.healthcheck", name
        assert test[4] == f"127.0.0.1:{port}", name


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_every_service_reads_the_internal_token_made_before_it_starts(variant, request) -> None:
    """The internal ports listen on 0.0.0.0: without the token they would refuse to start
    (services/common/internal_auth.py), and with another one they would refuse each other."""
    services = request.getfixturevalue(variant)["services"]
    maker = services["internal-token"]
    assert module_of(maker["command"]) == "services.common.internal_auth"
    assert maker["command"][3:] == ["generate", f"{TOKEN_DIR}/internal-token"]
    assert maker["restart"] == "no"
    assert {(v["source"], v["target"]) for v in maker["volumes"]} == {("internal-token", TOKEN_DIR)}
    for name in LAYERSERVE_SERVICES:
        service = services[name]
        env = service["environment"]
        assert env["LAYERSERVE_INTERNAL_TOKEN_FILE"] == f"{TOKEN_DIR}/internal-token", name
        assert "LAYERSERVE_INTERNAL_TOKEN" not in env, name
        mounts = {(v["source"], v["target"], v.get("read_only")) for v in service["volumes"]}
        assert ("internal-token", TOKEN_DIR, True) in mounts, name
        condition = service["depends_on"]["internal-token"]["condition"]
        assert condition == "service_completed_successfully", name
    for dockerfile in DOCKERFILES:  # the volume takes the owner of the images' directory
        runs = " ".join(" ".join(args) for args in _instructions(dockerfile, "RUN"))
        assert f"chown layerserve /models {TOKEN_DIR}" in runs, dockerfile


def test_a_model_in_the_volume_reaches_the_worker_and_the_tokenizer(tmp_path, gpu) -> None:
    assert "models" in gpu["volumes"]
    variables = {"LAYERSERVE_MODEL_NAME": "my-model", "LAYERSERVE_MODEL_PATH": "/models/m.gguf"}
    compose = resolve(tmp_path, CPU_FILES, variables)
    worker = service_config(compose, "worker")
    assert (worker.model_name, worker.model_path) == ("my-model", "/models/m.gguf")
    assert service_config(compose, "tokenizer").models == (("my-model", "/models/m.gguf"), MINILM)
    for name in ("worker", "tokenizer"):
        mounts = {(v["source"], v["target"]) for v in compose["services"][name]["volumes"]}
        assert ("models", "/models") in mounts, name
    # Without them: the embedded default model on both sides.
    assert service_config(gpu, "worker").model_path is None
    assert service_config(gpu, "tokenizer").models == (("smollm2-135m-instruct", None), MINILM)


def test_every_module_the_containers_run_exists(gpu, cpu) -> None:
    commands = [
        command
        for compose in (gpu, cpu)
        for service in compose["services"].values()
        for command in (service.get("command"), (service.get("healthcheck") or {}).get("test"))
        if command
    ]
    commands += [cmd for path in DOCKERFILES for cmd in _instructions(path, "CMD")]
    modules = {module_of(c[1:] if c[0] == "CMD" else c) for c in commands} - {None}
    assert {f"services.{name}" for name in LAYERSERVE_SERVICES} <= modules
    assert "services.launcher" in modules  # the images' default command
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_copy_files_that_exist_and_reach_the_builder(dockerfile) -> None:
    sources = [
        source
        for args in _instructions(dockerfile, "COPY")
        if not any(arg.startswith("--from=") for arg in args)
        for source in args[:-1]
    ]
    assert {"pyproject.toml", "services", "layerserve"} <= set(sources)
    patterns = (REPO / ".dockerignore").read_text().split("\n")
    for source in sources:
        assert (REPO / source).exists(), source
        assert not _ignored(source, patterns), f"{source} is excluded by .dockerignore"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_install_as_the_makefile_does(dockerfile) -> None:
    """The Makefile's pins in its order (torch first), then the project itself."""
    makefile = (REPO / "Makefile").read_text()
    pinned = re.compile(r"pip install ((?:--no-deps )?[\w.-]+==[\w.+-]+)")
    expected = pinned.findall(makefile.replace("$(PIP)", "pip"))
    assert expected[0].startswith("torch==")
    runs = [" ".join(args) for args in _instructions(dockerfile, "RUN")]
    installs = [m for run in runs for m in pinned.findall(run)]
    assert installs == expected
    assert [run for run in runs if "pip install" in run][-1].endswith("pip install .")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_build_the_cpu_attention_into_the_venv_the_runtime_copies(dockerfile) -> None:
    """As `make install` does, after `pip install .`, in the stage whose venv the runtime
    stage copies, from a folder where `python -m` runs the installed package: from the source
    tree it would build into /src/build, which no stage copies, and the worker would not find
    it (it falls back to torch ops)."""
    module = _makefile_module("cpu-attention")
    assert importlib.util.find_spec(module) is not None, module
    built_in = None
    for word, rest in _steps(dockerfile):
        if word == "FROM":
            stage, workdir, sources_in, installed = rest.split()[-1], "/", set(), False
        elif word == "WORKDIR":
            workdir = rest
        elif word == "COPY" and "services" in shlex.split(rest)[:-1]:
            sources_in.add(workdir)
        elif word == "RUN" and rest == "pip install .":
            installed = True
        elif word == "RUN" and f"python -m {module}" in rest:
            assert installed, "built before the project is installed"
            assert workdir not in sources_in, f"built from the source tree in {workdir}"
            built_in = stage
    assert built_in, f"{dockerfile} does not run python -m {module}"
    assert [f"--from={built_in}", "/opt/venv", "/opt/venv"] in _instructions(dockerfile, "COPY")


def test_a_non_editable_install_carries_the_cpu_attention_source(tmp_path: Path) -> None:
    """What the images' `pip install .` puts in site-packages holds the C++ source, which the
    extension compiles and keys its build by: without it the worker finds no build."""
    sources = {p.relative_to(REPO).as_posix() for p in REPO.glob("services/**/csrc/*")}
    assert sources
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "pyproject.toml", project)
    for name in ("services", "layerserve"):  # what the Dockerfiles copy
        shutil.copytree(REPO / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "wheel", str(project), "--no-deps", "--no-index"]
    command += ["--no-build-isolation", "--quiet", "--wheel-dir", str(tmp_path / "dist")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("layerserve-*.whl")
    assert sources <= set(zipfile.ZipFile(wheel).namelist())


def _makefile_module(target: str) -> str:
    """The module the Makefile's `target` runs (`$(PY) -m MODULE`)."""
    makefile = (REPO / "Makefile").read_text()
    found = re.search(rf"^{re.escape(target)}:.*\n\t\$\(PY\) -m (\S+)", makefile, re.MULTILINE)
    assert found, f"no `$(PY) -m` recipe for {target} in the Makefile"
    return found[1]


def _steps(dockerfile: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of every instruction in order (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", (REPO / dockerfile).read_text())
    steps = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word and not word.startswith("#"):
            steps.append((word.upper(), rest.strip()))
    return steps


def _instructions(dockerfile: str, keyword: str) -> list[list[str]]:
    """The arguments of every `keyword` instruction (exec form decoded)."""
    return [
        json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        for word, rest in _steps(dockerfile)
        if word == keyword
    ]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps `path` out of the build context: the last pattern that
    matches it or one of its parent folders wins."""
    parents = [str(p) for p in reversed(Path(path).parents) if str(p) != "."] + [path]
    ignored = False
    for pattern in (p.strip() for p in patterns):
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        if any(fnmatch.fnmatchcase(p, pattern.lstrip("!")) for p in parents):
            ignored = not negated
    return ignored
