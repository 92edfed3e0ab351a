"""The launcher's supervision (services/launcher_supervisor.py) on a fake stack and clock: an
exited process is started again after a backoff that doubles while it keeps crashing and
resets once it has run a while; every exit and restart is logged; nothing else is touched.
tests/reliability/test_launcher.py does it to a real `python -m services.launcher`."""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

import pytest

from services.common.internal_auth import InternalAuth
from services.launcher import internal_token_env
from services.launcher_supervisor import Backoff, Supervisor, describe_exit


@dataclass
class FakeProc:
    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class FakeStack:
    def __init__(self, *names: str) -> None:
        self.procs = {name: FakeProc(pid=100 + i) for i, name in enumerate(names)}
        self.restarted: list[str] = []

    def restart(self, name: str) -> None:
        self.restarted.append(name)
        self.procs[name] = FakeProc(pid=self.procs[name].pid + 1000)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup() -> tuple[FakeStack, Clock, Supervisor]:
    stack, clock = FakeStack("worker0", "scheduler", "redis"), Clock()
    backoff = Backoff(first_s=1.0, max_s=4.0, reset_after_s=60.0)
    return stack, clock, Supervisor(stack, backoff, clock)  # type: ignore[arg-type]


def crash(stack: FakeStack, name: str, code: int = -signal.SIGKILL) -> None:
    stack.procs[name].returncode = code


def test_a_killed_process_is_started_again_after_the_backoff(setup, caplog) -> None:
    stack, clock, supervisor = setup
    caplog.set_level(logging.INFO, logger="layerserve")
    supervisor.poll()
    assert stack.restarted == []
    crash(stack, "redis")
    clock.now = 10.0
    supervisor.poll()
    assert stack.restarted == []  # not before its backoff
    clock.now = 10.9
    supervisor.poll()
    assert stack.restarted == []
    clock.now = 11.0
    supervisor.poll()
    assert stack.restarted == ["redis"]
    assert supervisor.restarts("redis") == 1
    assert "redis was killed by SIGKILL after 10.0s; starting it again in 1s" in caplog.text
    assert "started redis again (pid 1102, restart 1)" in caplog.text
    clock.now = 20.0
    supervisor.poll()
    assert stack.restarted == ["redis"]  # running again: left alone


def test_the_backoff_doubles_while_it_keeps_crashing_and_resets_after_a_good_run(setup) -> None:
    stack, clock, supervisor = setup
    waits = []
    for _ in range(5):  # crashes at once, every time
        crash(stack, "worker0", 1)
        supervisor.poll()
        started = clock.now
        while len(stack.restarted) < len(waits) + 1:
            clock.now += 0.5
            supervisor.poll()
        waits.append(clock.now - started)
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]
    clock.now += 61  # a good run
    crash(stack, "worker0", 1)
    supervisor.poll()
    clock.now += 1.0
    supervisor.poll()
    assert len(stack.restarted) == 6
    assert set(stack.restarted) == {"worker0"}


def test_exit_descriptions() -> None:
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with status 3"


def test_the_launcher_makes_a_token_unless_the_operator_gave_one() -> None:
    made = internal_token_env({})
    token = made["LAYERSERVE_INTERNAL_TOKEN"]
    assert InternalAuth.from_env(made).token == token
    assert internal_token_env({}) != made  # one per run
    assert internal_token_env({"LAYERSERVE_INTERNAL_TOKEN": "x" * 20}) == {}
    assert internal_token_env({"LAYERSERVE_INTERNAL_TOKEN_FILE": "/run/t"}) == {}
