"""Several models at once: two distinct models (the embedded SmolLM2 and a tiny random Llama
checkpoint), aliases over them, and workers added, drained and removed through the Admin API
while requests keep succeeding."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.scheduler.v1 import admin_pb2
from services.stack import Stack, StackConfig
from services.stack_file import ModelSpec
from tests.e2e.conftest import MODEL, free_ports
from tests.e2e.helpers import sse_events
from tests.e2e.multi_model import (
    ADMIN_KEY,
    ALIASES,
    AUTH,
    TINY,
    Admin,
    complete,
    eventually,
    served_by,
    start_worker,
    stop_process,
)

READY = admin_pb2.WORKER_STATE_READY
DRAINING = admin_pb2.WORKER_STATE_DRAINING


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[Stack]:
    http, grpc_port, tok, sched, w0, w1 = free_ports(6)
    log_dir = tmp_path_factory.mktemp("multi-logs")
    aliases = log_dir / "aliases.toml"
    aliases.write_text(ALIASES)
    config = StackConfig(
        http_port=http,
        grpc_port=grpc_port,
        tokenizer_port=tok,
        scheduler_port=sched,
        worker_ports=(w0, w1),
        models=(ModelSpec(MODEL), ModelSpec(TINY, str(tiny_dir))),
        aliases_file=aliases,
        worker_args=["--num-blocks", "256"],
        log_dir=log_dir,
        env={"LAYERSERVE_API_KEYS": "e2e-test-key", "LAYERSERVE_ADMIN_KEY": ADMIN_KEY},
    )
    stack = Stack(config)
    try:
        stack.start()
    except Exception:
        for log in sorted(log_dir.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}")
        raise
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def admin(multi: Stack) -> Iterator[Admin]:
    client = Admin(multi.config.scheduler_port)
    yield client
    client.close()


# -- two models ----------------------------------------------------------------------------


def test_both_models_answer_and_name_themselves(multi: Stack) -> None:
    prompt = "The capital of France is"
    texts = {}
    for model in (MODEL, TINY):
        response = complete(multi, model, prompt, max_tokens=6)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == model
        assert body["usage"]["completion_tokens"] >= 1
        texts[model] = body["choices"][0]["text"]
    assert texts[MODEL] != texts[TINY]  # SmolLM2 and random weights do not agree


def test_stream_chunks_name_the_model(multi: Stack) -> None:
    body = {"model": TINY, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    url = f"{multi.http_url}/v1/chat/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=AUTH) as response:
        assert response.status_code == 200
        chunks = [e for e in sse_events(response) if e != "[DONE]"]
    assert chunks and {c["model"] for c in chunks} == {TINY}


def test_models_endpoint_lists_models_and_aliases(multi: Stack) -> None:
    response = httpx.get(f"{multi.http_url}/v1/models", headers=AUTH)
    assert response.status_code == 200
    listed = {m["id"]: m["max_model_len"] for m in response.json()["data"]}
    assert set(listed) == {MODEL, TINY, "canary", "auto"}
    assert listed["canary"] == min(listed[MODEL], listed[TINY])


def test_unknown_model_is_404(multi: Stack) -> None:
    response = complete(multi, "no-such-model", "Hello")
    assert response.status_code == 404
    assert "no-such-model" in response.json()["error"]["message"]


# -- aliases -------------------------------------------------------------------------------


def test_canary_alias_sends_exactly_its_share(multi: Stack) -> None:
    served = [served_by(multi, "canary", f"Request {i}:") for i in range(20)]
    assert Counter(served) == {MODEL: 18, TINY: 2}  # 90/10, exactly, over 2 x 10 requests


def test_length_alias_routes_short_and_long_prompts(multi: Stack) -> None:
    assert served_by(multi, "auto", [1, 2, 3, 4, 5, 6, 7, 8]) == TINY  # 8 tokens: the limit
    assert served_by(multi, "auto", [1, 2, 3, 4, 5, 6, 7, 8, 9]) == MODEL
    assert served_by(multi, "auto", "Hi") == TINY
    assert served_by(multi, "auto", "Tell me about the history of Rome, " * 10) == MODEL


def test_alias_set_at_run_time_is_used_at_once(multi: Stack, admin: Admin) -> None:
    alias = admin_pb2.SetAliasRequest()
    alias.alias.name = "tiny-only"
    alias.alias.weighted.targets.add(model=TINY, weight=1)
    assert admin.call("SetAlias", alias).replaced is False
    assert served_by(multi, "tiny-only", "Hello") == TINY
    admin.call("DeleteAlias", admin_pb2.DeleteAliasRequest(name="tiny-only"))
    assert eventually(lambda: complete(multi, "tiny-only", "Hello").status_code == 404, 10)


def test_alias_to_an_unknown_model_is_refused(admin: Admin) -> None:
    alias = admin_pb2.SetAliasRequest()
    alias.alias.name = "typo"
    alias.alias.weighted.targets.add(model="tiny-lama", weight=1)
    with pytest.raises(grpc.RpcError) as err:
        admin.call("SetAlias", alias)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


# -- admin API -----------------------------------------------------------------------------


def test_admin_needs_the_admin_key(multi: Stack) -> None:
    for key in (None, "e2e-test-key", "wrong"):  # an API key is not an admin key
        client = Admin(multi.config.scheduler_port, key)
        with pytest.raises(grpc.RpcError) as err:
            client.call("ListWorkers", admin_pb2.ListWorkersRequest())
        client.close()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_admin_is_disabled_without_a_configured_key(tmp_path: Path) -> None:
    sched, nowhere = free_ports(2)
    args = ["--port", str(sched), "--worker", f"127.0.0.1:{nowhere}"]
    env = {k: v for k, v in os.environ.items() if k != "LAYERSERVE_ADMIN_KEY"}
    proc = subprocess.Popen([sys.executable, "-m", "services.scheduler", *args], env=env)
    client = Admin(sched, "anything")
    try:
        client.wait_ready(timeout=60)
        with pytest.raises(grpc.RpcError) as err:
            client.call("ListWorkers", admin_pb2.ListWorkersRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "LAYERSERVE_ADMIN_KEY" in (err.value.details() or "")
    finally:
        client.close()
        stop_process(proc)


class Traffic(threading.Thread):
    """Sends requests for one model back to back until stopped; keeps every status."""

    def __init__(self, stack: Stack, model: str) -> None:
        super().__init__(daemon=True)
        self.stack, self.model = stack, model
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        i = 0
        while not self._halt.is_set():
            response = complete(self.stack, self.model, f"Background {i}:", max_tokens=4)
            self.statuses.append(response.status_code)
            if response.status_code != 200:
                self.errors.append(response.text)
            i += 1

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)


@pytest.fixture(scope="module")
def extra_worker(multi: Stack, tiny_dir: Path) -> Iterator[str]:
    """A second worker process of the tiny model, not known to the scheduler at start."""
    (port,) = free_ports(1)
    proc = start_worker(port, TINY, tiny_dir, multi.config.log_dir / "extra-worker.log")
    yield f"127.0.0.1:{port}"
    stop_process(proc)


def add(address: str) -> admin_pb2.AddWorkerRequest:
    # A worker process takes a while to start on a busy machine; AddWorker waits for it.
    return admin_pb2.AddWorkerRequest(address=address, timeout_seconds=120)


def burst(stack: Stack, model: str, n: int) -> list[int]:
    with ThreadPoolExecutor(n) as pool:
        prompts = [f"Burst {i}: tell me a story about number {i}" for i in range(n)]
        return [r.status_code for r in pool.map(lambda p: complete(stack, model, p), prompts)]


def test_replica_added_drained_and_removed_while_serving(
    multi: Stack, admin: Admin, extra_worker: str
) -> None:
    traffic = Traffic(multi, TINY)
    traffic.start()
    try:
        added = admin.call("AddWorker", add(extra_worker))
        assert (added.model, added.state) == (TINY, READY)
        assert added.model_path  # the tokenizer service could load the tokenizer from it
        eventually(lambda: burst(multi, TINY, 4) and admin.steps(extra_worker) > 0)

        drained = admin.call("DrainWorker", admin_pb2.DrainWorkerRequest(address=extra_worker))
        assert drained.state == DRAINING
        eventually(lambda: admin.workers()[extra_worker].in_flight == 0)
        steps = eventually(lambda: _settled_steps(admin, extra_worker))
        assert burst(multi, TINY, 4) == [200] * 4
        assert admin.steps(extra_worker) == steps  # nothing new went to the drained worker

        removed = admin.call("RemoveWorker", admin_pb2.RemoveWorkerRequest(address=extra_worker))
        assert removed.requests_ended == 0
        assert extra_worker not in admin.workers()
        assert burst(multi, TINY, 2) == [200] * 2
    finally:
        traffic.stop()
    assert traffic.errors == [] and len(traffic.statuses) >= 3


def _settled_steps(admin: Admin, address: str) -> int | None:
    """The worker's step count once it stays put for a moment (a last step may still be
    telling the worker which requests finished)."""
    before = admin.steps(address)
    threading.Event().wait(0.5)
    return before if admin.steps(address) == before else None


def test_forced_removal_ends_running_requests_with_unavailable(
    multi: Stack, admin: Admin, extra_worker: str
) -> None:
    (original,) = [a for a, w in admin.workers().items() if w.model == TINY]
    admin.call("AddWorker", admin_pb2.AddWorkerRequest(address=extra_worker))
    admin.call("DrainWorker", admin_pb2.DrainWorkerRequest(address=original))
    body = {"model": TINY, "prompt": "Go on:", "max_tokens": 3000, "ignore_eos": True}
    url = f"{multi.http_url}/v1/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=AUTH) as response:
        events = sse_events(response)
        assert next(events)["model"] == TINY  # it runs, on the extra worker
        force = admin_pb2.RemoveWorkerRequest(address=extra_worker, force=True)
        assert admin.call("RemoveWorker", force).requests_ended == 1
        rest = list(events)
    error = next(e for e in rest if isinstance(e, dict) and "error" in e)["error"]
    assert "removed by an operator" in error["message"], error

    # Only a draining worker is left: the model is unavailable, not unknown.
    response = complete(multi, TINY, "Hello")
    assert response.status_code == 503 and "draining" in response.json()["error"]["message"]
    admin.call("RemoveWorker", admin_pb2.RemoveWorkerRequest(address=original))
    admin.call("AddWorker", admin_pb2.AddWorkerRequest(address=original))
    assert complete(multi, TINY, "Hello").status_code == 200


def test_new_model_added_at_run_time_is_served(
    multi: Stack, admin: Admin, tiny_dir: Path, tmp_path: Path
) -> None:
    """The tokenizer service has no tokenizer for it: it loads one from the model's path."""
    late_dir = shutil.copytree(tiny_dir, tmp_path / "late")  # a path nothing has loaded yet
    (port,) = free_ports(1)
    proc = start_worker(port, "tiny-late", late_dir, tmp_path / "late-worker.log")
    address = f"127.0.0.1:{port}"
    try:
        added = admin.call("AddWorker", add(address))
        assert added.model == "tiny-late" and added.model_path == str(late_dir)
        response = complete(multi, "tiny-late", "Hello")
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "tiny-late"
        listed = httpx.get(f"{multi.http_url}/v1/models", headers=AUTH).json()["data"]
        assert "tiny-late" in {m["id"] for m in listed}
        admin.call("RemoveWorker", admin_pb2.RemoveWorkerRequest(address=address))
    finally:
        stop_process(proc)
