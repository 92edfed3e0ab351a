"""What `make run` starts, under faults (issue 17 rows 7 and 8), on a real
`python -m services.launcher --null-worker`:

- its redis-server, then its tokenizer, SIGKILLed while clients send requests: the launcher
  starts each again (logged), the stack keeps serving (rate limits fail open while Redis is
  away), and only the requests the tokenizer held when it died fail, with a clear 503;
- its internal ports refuse callers without the token it generated (UNAUTHENTICATED), health
  checks aside;
- SIGTERM stops it all, and nothing else did;
- an internal service told to listen beyond loopback with no token nor mutual TLS refuses to
  start, in one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from layerserve.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.internal_auth import METADATA_KEY
from tests.reliability.conftest import eventually
from tests.reliability.launcher_process import Launcher, free_port_block
from tests.reliability.load import COMPLETED, ERRORED, LOST
from tests.reliability.record import write_record
from tests.reliability.test_redis_faults import RequestLoop

AWAY_S = 2.0  # seconds of load kept up after each kill
LIMITS = {  # far above the test's rate: every request still goes through the Redis limiter
    "LAYERSERVE_DEFAULT_REQUESTS_PER_MINUTE": "1000000",
    "LAYERSERVE_DEFAULT_TOKENS_PER_MINUTE": "100000000",
}


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    log = Path(tmp_path_factory.mktemp("launcher")) / "launcher.log"
    launcher = Launcher(log, LIMITS)
    try:
        launcher.wait_ready()
        yield launcher
    finally:
        launcher.stop()
        if "Traceback" in log.read_text(errors="replace"):
            print(log.read_text(errors="replace")[-6000:])


def test_internal_ports_refuse_calls_without_the_launchers_token(launcher: Launcher):
    calls = {
        "scheduler ListModels": lambda ch, md: scheduler_pb2_grpc.SchedulerStub(ch).ListModels(
            scheduler_pb2.ListModelsRequest(), metadata=md, timeout=10
        ),
        # What row 8 of issue 17 did: submit to the scheduler directly, past the gateway.
        "scheduler Session": lambda ch, md: list(
            scheduler_pb2_grpc.SchedulerStub(ch).Session(
                iter([scheduler_pb2.SessionRequest()]), metadata=md, timeout=10
            )
        ),
        "tokenizer Session": lambda ch, md: list(
            tokenizer_pb2_grpc.TokenizerStub(ch).Session(
                iter([tokenizer_pb2.SessionRequest()]), metadata=md, timeout=10
            )
        ),
        "worker Describe": lambda ch, md: worker_pb2_grpc.WorkerStub(ch).Describe(
            worker_pb2.DescribeRequest(), metadata=md, timeout=10
        ),
    }
    ports = {
        "scheduler": launcher.scheduler_port,
        "tokenizer": launcher.tokenizer_port,
        "worker": launcher.worker_port,
    }
    refused = {}
    for name, call in calls.items():
        with grpc.insecure_channel(f"127.0.0.1:{ports[name.split()[0]]}") as channel:
            for label, metadata in (("none", ()), ("wrong", ((METADATA_KEY, "x" * 32),))):
                with pytest.raises(grpc.RpcError) as err:
                    call(channel, metadata)
                refused[f"{name} ({label} token)"] = err.value.code().name
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert set(refused.values()) == {"UNAUTHENTICATED"}, refused
    assert launcher.ok() == 200  # the stack's own calls carry the token
    write_record(
        "internal_auth",
        "internal ports without the internal token",
        {
            "load": "one call without the token and one with a wrong one to each internal "
            "port of a stack started by `python -m services.launcher`; then one request "
            "through the gateway",
            "faults": ["internal rpcs from outside the stack (tokenizer, scheduler, worker)"],
            "outcomes": {COMPLETED: 1, ERRORED: len(refused), LOST: 0},
            "notes": [
                f"{len(refused)} of {len(refused)} calls refused with UNAUTHENTICATED "
                "(tokenizer, scheduler, worker); health checks answered SERVING",
            ],
        },
    )


def test_the_launcher_restarts_a_killed_redis_and_tokenizer_and_serving_goes_on(
    launcher: Launcher,
):
    before = launcher.children()
    assert {"gateway", "tokenizer", "scheduler", "worker", "redis"} <= set(before), before

    class Stack:  # what RequestLoop needs of a stack
        http_url = launcher.http_url

    with RequestLoop(Stack, 4) as loop:  # type: ignore[arg-type]
        time.sleep(1.0)
        os.kill(before["redis"], signal.SIGKILL)
        redis_killed_at = time.monotonic()
        new_redis = launcher.wait_for_new("redis", before["redis"])
        redis_back_s = time.monotonic() - redis_killed_at
        time.sleep(AWAY_S)
        os.kill(before["tokenizer"], signal.SIGKILL)
        tokenizer_killed_at = time.monotonic()
        launcher.wait_for_new("tokenizer", before["tokenizer"])
        eventually(lambda: launcher.ok() == 200, "served again", 60)
        served_again_at = time.monotonic()
        serving_again_s = served_again_at - tokenizer_killed_at
        time.sleep(AWAY_S)
    after = launcher.children()
    statuses = [s for _, s in loop.statuses]
    around_redis = [s for t, s in loop.statuses if redis_killed_at <= t < tokenizer_killed_at]
    failed = [s for s in statuses if s != 200]
    away = [s for t, s in loop.statuses if tokenizer_killed_at <= t < served_again_at]
    log = launcher.log()

    write_record(
        "launcher_restarts",
        "`make run`'s Redis and tokenizer killed",
        {
            "load": "4 clients sending short chat requests back to back to a stack started "
            "by `python -m services.launcher --null-worker` (its own redis-server, rate limits "
            "in it)",
            "faults": [
                "SIGKILL to the redis-server the launcher started",
                f"{AWAY_S:g}s later, SIGKILL to the tokenizer",
            ],
            "outcomes": {
                COMPLETED: statuses.count(200),
                ERRORED: len([s for s in failed if s]),
                LOST: failed.count(0),
            },
            "errors": {str(s): failed.count(s) for s in sorted(set(failed))},
            "notes": [
                f"Redis started again by the launcher {redis_back_s:.1f}s after the kill; "
                f"{len(around_redis)} requests around it, "
                f"{around_redis.count(200)} answered 200 (rate limits fail open)",
                f"the tokenizer started again and the stack served {serving_again_s:.1f}s "
                f"after its kill; the {len(away)} requests answered in between were "
                f"{away.count(503)} 503s (at once, while it was away) and {away.count(200)} "
                "200s",
                "gateway, scheduler and worker kept their pids; the launcher kept running",
            ],
        },
    )
    assert launcher.proc.poll() is None, log[-3000:]
    assert "redis was killed by SIGKILL" in log and "started redis again" in log, log[-3000:]
    assert "tokenizer was killed by SIGKILL" in log and "started tokenizer again" in log
    assert after["redis"] == new_redis
    assert {n: after[n] for n in ("gateway", "scheduler", "worker")} == {
        n: before[n] for n in ("gateway", "scheduler", "worker")
    }
    assert around_redis and all(s == 200 for s in around_redis), around_redis
    # A clear 503 for what the tokenizer held or was sent while away; none lost, none after.
    assert set(failed) <= {503}, failed
    assert [s for t, s in loop.statuses if t > served_again_at + 1.0 and s != 200] == []
    assert statuses[-4:] == [200] * 4
    assert serving_again_s < 30


def test_sigterm_stops_everything_the_launcher_started(launcher: Launcher):
    children = launcher.children()
    assert launcher.stop() == 0, launcher.log()[-3000:]
    for name, pid in children.items():
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), name
    assert "stopping" in launcher.log() or launcher.proc.returncode == 0


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("service", ["scheduler", "tokenizer"])
def test_an_internal_port_beyond_loopback_without_a_token_refuses_to_start(service: str):
    port = free_port_block(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERSERVE_")}
    command = [sys.executable, "-m", f"services.{service}", "--host", "0.0.0.0"]
    command += ["--port", str(port)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"cannot start: refusing to listen on 0.0.0.0:{port}"), done.stderr
    assert "Traceback" not in done.stderr
