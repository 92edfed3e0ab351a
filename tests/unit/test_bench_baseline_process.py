"""Each baseline runs in a child process: a baseline that dies with SIGSEGV (as llama.cpp
built with GGML_NATIVE=ON did in llama_decode on an AMX Xeon) is reported as crashed in its
row, and the rest of the run goes on."""

from __future__ import annotations

import pytest

from benchmarks.baseline_process import BaselineCrashed, BaselineProcess
from benchmarks.l2_engine import measure
from benchmarks.l2_sides import Job, System
from benchmarks.progress import Progress
from benchmarks.sampling import GREEDY
from benchmarks.scales import SCALES
from tests.unit.bench_doubler import Doubler


class CountingProgress(Progress):
    def __init__(self) -> None:
        super().__init__(0, enabled=False)
        self.done = 0

    def advance(self, runs: int = 1) -> None:
        self.done += runs


def test_a_child_that_segfaults_is_reported_and_its_sibling_goes_on() -> None:
    crashing, healthy = BaselineProcess(Doubler, 3), BaselineProcess(Doubler, 5)
    try:
        tokens, seconds = crashing.call(Doubler.generate, 2)
        assert tokens == [6, 6] and seconds >= 0
        with pytest.raises(BaselineCrashed, match=r"killed by SIGSEGV \(rc 139\)"):
            crashing.call(Doubler.crash)
        with pytest.raises(BaselineCrashed, match="SIGSEGV"):  # and stays crashed
            crashing.call(Doubler.generate, 1)
        assert healthy.call(Doubler.generate, 1)[0] == [10]
    finally:
        crashing.close()
        healthy.close()


def test_an_exception_in_the_child_is_an_answer_not_a_crash() -> None:
    child = BaselineProcess(Doubler, 1)
    try:
        with pytest.raises(BaselineCrashed, match="raised in its process: TypeError: can't"):
            child.call(Doubler.generate, "two")
        assert child.call(Doubler.generate, 1)[0] == [2]
    finally:
        child.close()


def test_a_crashed_baseline_gets_its_row_and_the_other_sides_are_measured() -> None:
    job = Job("mixed", [[1, 2]], [4], GREEDY, [0], 1, SCALES["tiny"])
    crashing = BaselineProcess(Doubler, 1)
    calls: list[str] = []

    def ours() -> float:
        calls.append("ours")
        return 0.5

    def theirs() -> float:
        return crashing.call(Doubler.crash)[1]

    systems = [
        System("layerserve", "default", "bfloat16", lambda: None, ours),
        System("llama-cpp", "default", "Q4_1 (as shipped)", lambda: None, theirs, "llama"),
        System("hf-static", "equal", "float32", lambda: None, lambda: 2.0),
    ]
    progress = CountingProgress()
    try:
        rows = {row["system"]: row for row in measure(systems, job, 2, progress)}
    finally:
        crashing.close()
    assert calls == ["ours", "ours"]  # both repeats ran after the crash in the first
    assert rows["layerserve"]["wall_s"] == 0.5 and rows["layerserve"]["output_tok_s"] == 8.0
    assert rows["hf-static"]["runs_s"] == [2.0, 2.0]
    crashed = rows["llama-cpp"]
    assert crashed["crashed"] and crashed["wall_s"] is None and crashed["output_tok_s"] is None
    assert crashed["note"].startswith("crashed: killed by SIGSEGV (rc 139)")
    assert progress.done == 6  # the crashed side's runs are counted as done
