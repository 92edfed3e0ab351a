"""`kubectl apply -k deploy/k8s/overlays/{cpu,gpu}` would start a working stack: both overlays
render with the real kustomize (tests/unit/k8s_manifests.py), every object is valid against
the Kubernetes API schemas (kubernetes-validate, offline), the images are the ones our
Dockerfiles build, every service accepts the configuration it is given and finds the others
through Services that select its pods, probes ask each service's own port, the scheduler runs
as several replicas that roll and drain one at a time, and the autoscalers and disruption
budgets aim at what exists."""

from __future__ import annotations

import copy
import importlib.util
import shutil
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest

from layerserve.scheduler.v1 import admin_pb2, scheduler_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2
from layerserve.worker.v1 import worker_pb2
from services.common.health import service_name
from services.common.internal_auth import InternalAuth
from services.common.metrics import PREFIX
from services.common.tls import TlsSettings
from services.scheduler.aliases import load_alias_file
from services.scheduler.scheduler_metrics import SchedulerCollector
from tests.unit.compose_files import CPU_FILES, GPU_FILES, LAYERSERVE_SERVICES, REPO, resolve
from tests.unit.k8s_manifests import (
    DNS_TARGET,
    FIELDS,
    K8S,
    OVERLAYS,
    POD_IP,
    Obj,
    component,
    container_env,
    container_port,
    deployments_of,
    deployments_of_all,
    find,
    layerserve_deployments,
    only_container,
    reaches,
    render,
    selected,
    service_config,
)

KUBERNETES_VERSION = "1.33.0"  # the oldest release we claim to run on (docs/deploy.md)
DOCS = REPO / "docs" / "deploy.md"
QUEUE_METRIC = "layerserve_num_requests_waiting"  # prometheus-adapter's name for the gauge
# The sentence-embedding model's workers (issue 30): on the CPU image in both flavours, float32.
ENCODER = "worker-all-minilm-l6-v2"
# SERVING whenever the scheduler process runs (until its drain), workers or not.
SCHEDULER_ADMIN = service_name(admin_pb2, "Admin")
# The grpc.health.v1 service names each process reports ("" = the whole server).
HEALTH_SERVICES = {
    "scheduler": {
        "",
        service_name(scheduler_pb2, "Scheduler"),
        service_name(admin_pb2, "Admin"),
    },
    "tokenizer": {"", service_name(tokenizer_pb2, "Tokenizer")},
    "worker": {"", service_name(worker_pb2, "Worker")},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[Obj]]:
    return {
        name: render(K8S / "overlays" / name, tmp_path_factory.mktemp(name)) for name in OVERLAYS
    }


@pytest.fixture(scope="module")
def configs(rendered, tmp_path_factory) -> dict[str, dict[str, object]]:
    """overlay -> Deployment name -> its parsed service config (layerserve Deployments)."""
    return {
        overlay: {
            d["metadata"]["name"]: service_config(d, objects, tmp_path_factory.mktemp(overlay))
            for d in layerserve_deployments(objects)
        }
        for overlay, objects in rendered.items()
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_against_the_kubernetes_schemas(overlay, rendered) -> None:
    objects = rendered[overlay]
    kinds = {o["kind"] for o in objects}
    expected = {"Namespace", "ConfigMap", "Deployment", "Service"}
    assert expected | {"HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    for obj in objects:
        # strict: an unknown (say, misspelt) field is an error, not ignored.
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "layerserve", obj["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_sends_and_checks_the_internal_token_from_one_secret(
    overlay, rendered
) -> None:
    """Internal ports listen on 0.0.0.0: without a token they would refuse to start."""
    objects = rendered[overlay]
    for deployment in layerserve_deployments(objects):
        container = only_container(deployment)
        (entry,) = [e for e in container["env"] if e["name"] == "LAYERSERVE_INTERNAL_TOKEN"]
        assert entry["valueFrom"]["secretKeyRef"] == {"name": "layerserve-internal", "key": "token"}
        auth = InternalAuth.from_env(container_env(container, objects))
        assert auth.token and not auth.allow_insecure
        auth.check_bind("0.0.0.0:50060", TlsSettings())


def test_the_schema_check_refuses_a_misspelt_field(rendered) -> None:
    """The check above can fail: a field Kubernetes does not know is refused."""
    (gateway,) = deployments_of(rendered["cpu"], "gateway")
    broken = copy.deepcopy(gateway)
    broken["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_every_image_is_one_our_dockerfiles_build(rendered, tmp_path) -> None:
    """The names docker-compose.yml gives the images docker/Dockerfile* build, so that one
    `docker compose build` makes what the cluster runs (docs/deploy.md)."""
    built: dict[str, str] = {}  # image -> Dockerfile
    others: set[str] = set()
    for files in (GPU_FILES, CPU_FILES):
        for service in resolve(tmp_path, files)["services"].values():
            if "build" in service:
                built[service["image"]] = service["build"]["dockerfile"]
            else:
                others.add(service["image"])
    worker_dockerfile = {"cpu": "docker/Dockerfile", "gpu": "docker/Dockerfile.cuda"}
    for overlay, objects in rendered.items():
        for deployment in find(objects, "Deployment"):
            image = only_container(deployment)["image"]
            if component(deployment) not in LAYERSERVE_SERVICES:
                assert image in others, image  # Redis, as under docker compose
            elif component(deployment) == "worker" and deployment["metadata"]["name"] != ENCODER:
                assert built.get(image) == worker_dockerfile[overlay], (overlay, image)
            else:
                assert built.get(image) == "docker/Dockerfile", image


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_a_module_that_accepts_its_configuration(
    overlay, rendered, configs
) -> None:
    objects = rendered[overlay]
    assert {component(d) for d in layerserve_deployments(objects)} == set(LAYERSERVE_SERVICES)
    for deployment in layerserve_deployments(objects):
        container = only_container(deployment)
        assert importlib.util.find_spec(container["command"][2]) is not None
        # Spans name their pod (the variable it refers to is defined before it).
        env = container_env(container, objects)
        assert env["OTEL_RESOURCE_ATTRIBUTES"] == f"k8s.pod.name={FIELDS['metadata.name']}"
        assert env["OTEL_SERVICE_NAME"] == f"layerserve-{component(deployment)}"
    parsed = configs[overlay]
    assert {c.host for c in parsed.values()} == {"0.0.0.0"}  # reachable from other pods
    for deployment in deployments_of(objects, "worker"):
        worker = parsed[deployment["metadata"]["name"]]
        # The scheduler dials the pod's own address, on the port the worker listens on.
        assert worker.advertised_address == f"{POD_IP}:{worker.port}"
        assert worker.admin_key
        if deployment["metadata"]["name"] == ENCODER:
            assert (worker.model_name, worker.device, worker.dtype) == (
                "all-minilm-l6-v2",
                "cpu",
                "float32",
            )
            assert worker.model_path == "/opt/venv/models/all-minilm-l6-v2"  # docker/Dockerfile*
            continue
        assert worker.device == {"cpu": "cpu", "gpu": "cuda"}[overlay]
        # Not float32 forced on every device: the worker picks the device's dtype.
        assert worker.dtype == "auto"
    (scheduler,) = [parsed[d["metadata"]["name"]] for d in deployments_of(objects, "scheduler")]
    assert scheduler.workers == () and scheduler.worker_registration


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_find_each_other_through_services_that_select_their_pods(
    overlay, rendered, configs
) -> None:
    objects = rendered[overlay]
    parsed = configs[overlay]
    by_component = {
        component(d): parsed[d["metadata"]["name"]] for d in deployments_of_all(objects)
    }
    scheduler, tokenizer, gateway = (by_component[n] for n in ("scheduler", "tokenizer", "gateway"))
    # Every scheduler replica, not the one a Service's virtual IP would pick.
    assert tokenizer.scheduler.startswith(DNS_TARGET)
    assert reaches(objects, tokenizer.scheduler, "scheduler", scheduler.port)
    assert reaches(objects, gateway.tokenizer, "tokenizer", tokenizer.port)
    redis = scheduler.redis_url.removeprefix("redis://").removesuffix("/0")
    assert reaches(objects, redis, "redis", 6379)
    assert scheduler.redis_url == gateway.redis_url
    (scheduler_pod,) = deployments_of(objects, "scheduler")
    readiness = only_container(scheduler_pod)["readinessProbe"]["grpc"]
    for deployment in deployments_of(objects, "worker"):
        worker = parsed[deployment["metadata"]["name"]]
        assert reaches(objects, worker.register_with, "scheduler", scheduler.port)
        # The Service lists a scheduler that has no worker yet: either it lists replicas that
        # are not ready, or their readiness does not wait for a worker (else none registers).
        (service,) = find(objects, "Service", worker.register_with.split(":")[0])
        unready_listed = service["spec"].get("publishNotReadyAddresses") is True
        assert unready_listed or readiness.get("service") == SCHEDULER_ADMIN
        assert worker.admin_key == scheduler.admin_key  # from the same Secret


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_ask_each_services_own_health(overlay, rendered, configs) -> None:
    objects = rendered[overlay]
    for deployment in find(objects, "Deployment"):
        container = only_container(deployment)
        name = component(deployment)
        assert {"readinessProbe", "livenessProbe"} <= set(container), name
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = container.get(kind)
            for action in ("grpc", "httpGet", "tcpSocket"):
                if probe and action in probe:
                    container_port(container, probe[action]["port"])  # a declared port
        if name not in LAYERSERVE_SERVICES:
            continue
        config = configs[overlay][deployment["metadata"]["name"]]
        if name == "gateway":
            for kind, path in (("livenessProbe", "/health"), ("readinessProbe", "/ready")):
                assert container[kind]["httpGet"] == {"path": path, "port": config.http_port}
            continue
        # gRPC health (grpc.health.v1) on the service's own port, for a service it reports.
        readiness = container["readinessProbe"]["grpc"]
        assert readiness["port"] == config.port, name
        assert readiness.get("service", "") in HEALTH_SERVICES[name], name
        for kind in ("livenessProbe", "startupProbe"):
            probe = container.get(kind, {}).get("grpc")
            if probe:
                assert probe["port"] == config.port, (name, kind)
                assert probe.get("service", "") in HEALTH_SERVICES[name], (name, kind)
        if name == "worker":
            assert "grpc" in container["startupProbe"]  # loading the model comes first


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_selects_pods_that_serve_its_ports(overlay, rendered) -> None:
    objects = rendered[overlay]
    for service in find(objects, "Service"):
        pods = selected(objects, service["spec"]["selector"])
        assert pods, f"Service {service['metadata']['name']} selects no pods"
        for port in service["spec"]["ports"]:
            for pod in pods:
                container_port(only_container(pod), port["targetPort"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_autoscalers_and_disruption_budgets_aim_at_what_exists(overlay, rendered, configs) -> None:
    objects = rendered[overlay]
    deployments = {d["metadata"]["name"]: d for d in find(objects, "Deployment")}
    scaled: dict[str, list[Obj]] = {}  # component -> its autoscalers
    for hpa in find(objects, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
        assert target["name"] in deployments, target
        scaled.setdefault(component(deployments[target["name"]]), []).append(hpa)
    for name in ("gateway", "tokenizer"):
        (hpa,) = scaled[name]
        assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    # Each model's workers scale on that model's queue depth.
    workers = deployments_of(objects, "worker")
    assert len(scaled["worker"]) == len(workers)
    for hpa in scaled["worker"]:
        deployment = deployments[hpa["spec"]["scaleTargetRef"]["name"]]
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "External"
        assert metric["external"]["metric"]["name"] == QUEUE_METRIC
        model = configs[overlay][deployment["metadata"]["name"]].model_name
        assert metric["external"]["metric"]["selector"]["matchLabels"] == {"model": model}
    budgeted = set()
    for pdb in find(objects, "PodDisruptionBudget"):
        matched = selected(objects, pdb["spec"]["selector"]["matchLabels"])
        assert len(matched) == 1, pdb["metadata"]["name"]
        budgeted.add(component(matched[0]))
    assert {"gateway", "tokenizer", "scheduler", "worker"} <= budgeted


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scheduler_replicas_roll_and_drain_one_at_a_time(overlay, rendered) -> None:
    """Several schedulers, so that losing one (a rollout, a node drain, a crash) leaves the
    others serving: a rolling update adds one and removes one at a time, a disruption budget
    lets a drain take one, and a replica without workers still counts as available."""
    objects = rendered[overlay]
    (deployment,) = deployments_of(objects, "scheduler")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1},
    }
    (budget,) = find(objects, "PodDisruptionBudget", "scheduler")
    assert selected(objects, budget["spec"]["selector"]["matchLabels"]) == [deployment]
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    # A replica that is not ready protects nothing: it never blocks a node drain.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # Ready without a worker of its own (there may be fewer workers than replicas): the
    # Admin service, not the whole server's status, which waits for one.
    readiness = only_container(deployment)["readinessProbe"]["grpc"]
    assert readiness["service"] == SCHEDULER_ADMIN


def test_the_adapter_rule_in_the_docs_serves_the_schedulers_gauge() -> None:
    """The worker HPA's external metric is the scheduler's queue gauge, renamed by the
    prometheus-adapter rule docs/deploy.md gives."""
    gauge = f"{PREFIX}num_requests_waiting"
    assert gauge in {family.name for family in SchedulerCollector(lambda: []).collect()}
    docs = DOCS.read_text()
    assert f"seriesQuery: '{gauge}{{" in docs
    assert f'as: "{QUEUE_METRIC}"' in docs


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_resources_are_requested_and_only_gpu_workers_get_a_gpu(overlay, rendered) -> None:
    for deployment in find(rendered[overlay], "Deployment"):
        name = deployment["metadata"]["name"]
        resources = only_container(deployment)["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), name
        assert "memory" in resources["limits"]
        gpus = resources["limits"].get("nvidia.com/gpu")
        if overlay == "gpu" and component(deployment) == "worker" and name != ENCODER:
            assert gpus == 1 and resources["requests"]["nvidia.com/gpu"] == 1
        else:
            assert gpus is None, name


def test_the_secrets_named_are_the_ones_the_docs_say_to_create(rendered) -> None:
    docs = DOCS.read_text()
    for objects in rendered.values():
        named = set()
        for deployment in find(objects, "Deployment"):
            spec = deployment["spec"]["template"]["spec"]
            for var in only_container(deployment).get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    named.add((ref["name"], f"--from-literal={ref['key']}="))
            for volume in spec.get("volumes", []):
                if "secret" in volume:
                    for item in volume["secret"]["items"]:
                        named.add((volume["secret"]["secretName"], f"--from-file={item['key']}="))
        assert named
        assert not find(objects, "Secret")  # never committed
        for name, flag in named:
            assert f"kubectl -n layerserve create secret generic {name} {flag}" in docs, name


def test_the_models_config_lists_the_served_models_and_loads(rendered, tmp_path: Path) -> None:
    objects = rendered["cpu"]
    (config_map,) = find(objects, "ConfigMap", "layerserve-models")
    models_file = tmp_path / "models.toml"
    models_file.write_text(config_map["data"]["models.toml"])
    load_alias_file(models_file)  # what the scheduler does with it at start-up
    listed = {m["name"] for m in tomllib.loads(models_file.read_text())["models"]}
    served = {
        container_env(only_container(d), objects)["LAYERSERVE_MODEL_NAME"]
        for d in deployments_of(objects, "worker")
    }
    assert listed == served


@pytest.mark.parametrize(
    ("name", "removed", "error"),
    [
        ("worker", "LAYERSERVE_WORKER_ADVERTISE", "--advertise"),
        ("worker", "LAYERSERVE_ADMIN_KEY", "LAYERSERVE_ADMIN_KEY"),
        ("scheduler", "LAYERSERVE_ADMIN_KEY", "LAYERSERVE_ADMIN_KEY"),
    ],
)
def test_a_manifest_missing_a_registration_setting_fails_at_start_up(
    name, removed, error, rendered, tmp_path: Path
) -> None:
    """Not a worker that registers an address nobody can dial (0.0.0.0), nor a scheduler or a
    worker without the Admin API key registration goes through: each says what is missing."""
    objects = rendered["gpu"]
    deployment = copy.deepcopy(deployments_of(objects, name)[0])
    container = only_container(deployment)
    container["env"] = [var for var in container["env"] if var["name"] != removed]
    with pytest.raises(ValueError, match=error):
        service_config(deployment, objects, tmp_path)


def test_a_model_added_as_the_docs_say_gets_workers_of_its_own(tmp_path: Path) -> None:
    """docs/deploy.md "Add a model", steps 1 and 3, on a copy of deploy/k8s."""
    k8s = Path(shutil.copytree(K8S, tmp_path / "k8s"))
    default, new = "smollm2-135m-instruct", "tiny-model"
    base = k8s / "base"
    _copy_renamed(base / f"worker-{default}.yaml", base / f"worker-{new}.yaml", default, new)
    _append(k8s / "base" / "kustomization.yaml", f"  - worker-{new}.yaml\n")
    for overlay in OVERLAYS:
        here = k8s / "overlays" / overlay
        _copy_renamed(here / "worker.yaml", here / f"worker-{new}.yaml", default, new)
        _append(here / "kustomization.yaml", f"  - path: worker-{new}.yaml\n")
        objects = render(here, tmp_path / overlay)
        workers = [w for w in deployments_of(objects, "worker") if w["metadata"]["name"] != ENCODER]
        assert len(workers) == 2
        for worker in workers:
            config = service_config(
                worker, objects, tmp_path / overlay / worker["metadata"]["name"]
            )
            assert worker["metadata"]["name"] == f"worker-{config.model_name}"
            assert config.device == {"cpu": "cpu", "gpu": "cuda"}[overlay]
            for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget"):
                (own,) = find(objects, kind, worker["metadata"]["name"])
                if kind == "PodDisruptionBudget":
                    assert selected(objects, own["spec"]["selector"]["matchLabels"]) == [worker]
        resources = [only_container(w)["resources"] for w in workers]
        assert resources[0] == resources[1]  # the overlay's patch reached the new one too


def _copy_renamed(source: Path, target: Path, old: str, new: str) -> None:
    text = source.read_text()
    assert old in text
    target.write_text(text.replace(old, new))


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text().rstrip("\n") + "\n" + line)
