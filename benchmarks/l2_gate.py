"""L2's correctness gate: greedy tokens of the engine (float32) equal transformers' generate()
(one prompt at a time, no padding) on the first prompts of the first workload; if they do
not, no L2 number is measured. hf-continuous's agreement and llama.cpp's are reported beside
it, not gated: llama.cpp's quantised dot products are not the dequantised float32 arithmetic
both other sides do. transformers and llama.cpp answer from their child processes; a crash
there is written into the gate instead of ending the run."""

from __future__ import annotations

from benchmarks.baseline_process import BaselineCrashed, BaselineProcess
from benchmarks.hf_baseline import continuous_batching_available, hf_continuous, hf_generate
from benchmarks.l2_sides import blocks_for
from benchmarks.llama_cpp_baseline import LlamaCppEngine
from benchmarks.offline import OfflineEngine, make_runner
from benchmarks.progress import Progress
from benchmarks.sampling import GREEDY
from benchmarks.workload import Item
from services.scheduler.scheduler import SchedulerLimits
from services.worker.model.loader import LoadedModel


def correctness_gate(
    items: list[Item],
    gate_tokens: int,
    limits: SchedulerLimits,
    loaded: LoadedModel,
    hf: BaselineProcess,
    llama: BaselineProcess | None,
    progress: Progress,
    hf_continuous_too: bool = False,
) -> dict:
    """loaded: float32, as transformers runs. llama: a llama.cpp child, or None (not run).
    hf_continuous_too: also report transformers' continuous batching's agreement."""
    progress.stage("L2 correctness gate")
    prompts, outs = [i.prompt_ids for i in items], [gate_tokens] * len(items)
    gate: dict = {"prompts": len(items), "tokens": gate_tokens}
    try:
        reference = hf.call(hf_generate, prompts, outs, 1)[0]
    except BaselineCrashed as err:
        progress.note(f"L2 correctness gate: transformers {err}")
        return gate | {"engine": f"not checked: transformers {err}", "passed": False}
    runner = make_runner(loaded, blocks_for([Item(p, gate_tokens) for p in prompts], len(items)))
    engine = OfflineEngine(runner, limits)
    ours = engine.generate(prompts, outs)
    same = sum(ours[f"r{i}"] == reference[i] for i in range(len(items)))
    gate |= {"engine": f"{same}/{len(items)}", "passed": same == len(items)}
    try:
        if hf_continuous_too and hf.call(continuous_batching_available)[0]:
            theirs = hf.call(hf_continuous, prompts, outs)[0]
            gate["hf-continuous"] = f"{sum(map(_equal, theirs, reference))}/{len(items)}"
    except BaselineCrashed as err:
        gate["hf-continuous"] = str(err)
    if llama is not None:
        gate["llama-cpp"] = _llama_cpp_agreement(llama, hf, prompts, outs)
    progress.note(f"L2 correctness gate: {gate}")
    return gate


def _llama_cpp_agreement(llama: BaselineProcess, hf: BaselineProcess, prompts, outs) -> str:
    """Greedy agreement of llama.cpp with generate() on prompts that repeat a short pattern:
    their continuation is near-certain, so only a real fault (positions, sequences, batching)
    and not the rounding of Q4_1 dot products can change a token. On random ids the next-token
    distribution is flat enough that rounding alone flips the argmax."""
    patterned = [(p[:8] * (len(p) // 8 + 2))[: max(len(p), 16)] for p in prompts]
    try:
        reference = hf.call(hf_generate, patterned, outs, 1)[0]
        theirs = llama.call(LlamaCppEngine.generate, patterned, outs, GREEDY, [0] * len(prompts))
    except BaselineCrashed as err:
        return str(err)
    return f"{sum(map(_equal, theirs[0], reference))}/{len(prompts)}"


def _equal(a: list[int], b: list[int]) -> bool:
    return a == b
