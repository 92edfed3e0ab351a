"""Two replicas of a model behind one scheduler: requests sharing a system prompt land where
it is cached, and when a replica dies the others take the new requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.stack import Stack, StackConfig
from tests.e2e.conftest import API_KEY, MODEL, free_ports

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SYSTEM = "You are the support assistant of a small bakery. " + "Answer politely. " * 60


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    http, grpc_port, tok, sched, w0, w1 = free_ports(6)
    log_dir = Path(tmp_path_factory.mktemp("replica-logs"))
    config = StackConfig(
        http_port=http,
        grpc_port=grpc_port,
        tokenizer_port=tok,
        scheduler_port=sched,
        worker_ports=(w0, w1),
        model_name=MODEL,
        null_worker=True,
        scheduler_args=["--routing", "prefix"],
        log_dir=log_dir,
        env={"LAYERSERVE_API_KEYS": API_KEY, "LAYERSERVE_REDIS_URL": redis_url},
        ready_timeout=120,
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


def chat(stack: Stack, user: str) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 4,
    }
    return httpx.post(f"{stack.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)


def worker_stats(stack: Stack) -> dict[str, scheduler_pb2.WorkerStats]:
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.scheduler_port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        stats = stub.GetStats(scheduler_pb2.GetStatsRequest(model=MODEL), timeout=5)
    return {w.address: w for w in stats.workers}


def test_a_shared_system_prompt_is_served_from_one_replicas_cache(replicas: Stack):
    first = chat(replicas, "When do you open?")
    assert first.status_code == 200, first.text
    cached = []
    for question in ("Do you sell rye bread?", "Can I order a cake?", "Is there parking?"):
        response = chat(replicas, question)
        assert response.status_code == 200, response.text
        cached.append(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    # Every follow-up found the system prompt cached: they all went to the same replica.
    assert all(c >= prompt_tokens * 0.8 for c in cached), (cached, prompt_tokens)
    steps = sorted(w.steps for w in worker_stats(replicas).values())
    assert steps[0] == 0 and steps[1] > 0


def test_when_a_replica_dies_new_requests_go_to_the_other(replicas: Stack):
    for i in range(4):  # both replicas hold something; prefix routing favours one of them
        assert chat(replicas, f"warm-up {i}").status_code == 200
    busy = max(worker_stats(replicas).values(), key=lambda w: w.steps)
    victim = f"worker{replicas.config.worker_ports.index(int(busy.address.rsplit(':')[1]))}"
    replicas.kill(victim)  # the replica holding the system prompt
    answers = [chat(replicas, f"question {i}") for i in range(6)]
    assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
    assert busy.address not in worker_stats(replicas)
