"""Which (dtype, quantization) the CPU worker should default to: correctness and speed of each,
side by side in one run (issue 29: "the worker's default on this CPU is its fastest correct
setting").

    PYTHONPATH=. .venv/bin/python -m benchmarks.default_choice [--threads 1] [--reps 3]
        [--settings float32:none float32:gguf bfloat16:gguf bfloat16:none] [--model PATH]

Per setting, through the worker's ModelRunner and the scheduler (benchmarks/offline.py,
speculation off):
- greedy agreement with the first setting (float32 dense, the reference): 16 text prompts from
  benchmarks/data/public_domain.txt and 8 chat questions, 32 greedy tokens each; prompts that
  match exactly, and the share of tokens before the first divergence;
- the README's question ("What is the capital of France?"): the first answer token's four most
  likely candidates with their logprobs, and the greedy answer;
- batch-1 decode tok/s: a 128-token prompt, 128 tokens out, median of --reps, interleaved
  (each repetition runs every setting once), by wall clock and by this thread's CPU time.
With --llama-cpp (the llama-cpp extra installed): llama.cpp's first-token candidates and greedy
answer to the README's question on the same file, for reference. --model measures another GGUF
(Gemma 3 270M: docs/benchmarks.md, "Issue 29: K-quants and Q5_0 kept"); a setting
float32:gguf/Q4_K keeps only the weights the file stores as that type, and a third field sets
the KV cache's dtype as the worker's --kv-cache-dtype does (float32:gguf:int8; int8-widened:
the attention extension's float32 scores, without its int16 decode queries); gguf@KERNEL
computes the kept 4-bit weights with that Int4Weight kernel (float32:gguf@int16act: int16
activations, float32:gguf@int8act: int8, int8_activations.py; the Q8_0 head follows)."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.machine import load_average
from benchmarks.offline import BLOCK_SIZE, MODEL, OfflineEngine, make_engine, to_plan
from services.common.sampling import SamplingOptions
from services.scheduler.request import Request
from services.scheduler.scheduler import SchedulerLimits
from services.tokenizer.gguf_tokenizer import load_gguf_text_model
from services.worker.engine.model_runner import KV_CACHE_DTYPES, ModelRunner
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.cpu_attention import CpuAttention
from services.worker.layers.gguf_quant import TYPE_NAMES
from services.worker.layers.kv_cache import PagedKVCache, kv_cache_groups
from services.worker.model.gguf_weights import keep_gguf_quantized
from services.worker.model.loader import default_path, load_model
from services.worker.model.quant import quantize_loaded

TEXT = Path(__file__).parent / "data" / "public_domain.txt"
QUESTIONS = (
    "What is the capital of France?",
    "What is 2+2?",
    "Name three primary colors.",
    "Who wrote Romeo and Juliet?",
    "Give me a haiku about the sea.",
    "How do I boil an egg?",
    "What is photosynthesis?",
    "Translate 'good morning' to Spanish.",
)
GREEDY_TOKENS = 32


def build(setting: str, path: Path) -> OfflineEngine:
    """setting: dtype:quantization, or dtype:gguf/TYPE to keep only the weights the GGUF
    stores as TYPE (e.g. float32:gguf/Q4_K: what that one format costs in agreement); then
    optionally :KV, the KV cache's dtype (auto, float32, bfloat16 or int8)."""
    dtype, quantization, kv = (setting + ":auto").split(":")[:3]
    loaded = load_model(path, dtype=getattr(torch, dtype), device=torch.device("cpu"))
    quantization, _, kernel = quantization.partition("@")
    method, _, only = quantization.partition("/")
    if method == "gguf" and only:
        type_ids = {name: type_id for type_id, name in TYPE_NAMES.items()}
        kept = keep_gguf_quantized(loaded, kernel or "auto", types={type_ids[only]})
        print(f"{setting}: {kept} weights kept")
    else:
        loaded = quantize_loaded(loaded, quantization, kernel or "auto")
    if kv == "auto":
        return make_engine(loaded, 512, SchedulerLimits())
    cpu = torch.device("cpu")
    kv, _, variant = kv.partition("-")
    groups = kv_cache_groups(loaded.config)
    cache = PagedKVCache(loaded.config, 512, BLOCK_SIZE, KV_CACHE_DTYPES[kv], cpu, groups)
    backend = choose_attention_backend("auto", cpu, loaded.config.head_dim)
    if variant == "widened":  # the extension without its integer/bf16 passes (float32 scores)
        backend = CpuAttention(avx512_bf16=False)
    limit = loaded.config.max_position_embeddings
    runner = ModelRunner(loaded, cache, max_model_len=limit, model_name=MODEL, backend=backend)
    return OfflineEngine(runner, SchedulerLimits())


def first_token_candidates(engine: OfflineEngine, ids: list[int], text) -> str:
    """The four most likely first tokens after `ids`, with their logprobs. Leaves the request
    in the engine's scheduler: call it last."""
    request = Request("first", list(ids), 1, SamplingOptions(logprobs=4), frozenset())
    engine.scheduler.add(request)
    sampled = engine.runner.execute(to_plan(engine.scheduler.schedule()))[0]
    return ", ".join(f"{text.decode([t])!r} {lp:.2f}" for t, lp in sampled.top_logprobs)


def agreement(reference: list[list[int]], got: list[list[int]]) -> tuple[int, float]:
    """Prompts matching exactly, and the share of tokens before each prompt's divergence."""
    before = []
    for ref, out in zip(reference, got, strict=True):
        pairs = zip(ref, out, strict=True)
        before.append(next((i for i, (a, b) in enumerate(pairs) if a != b), len(ref)))
    exact = sum(n == GREEDY_TOKENS for n in before)
    return exact, sum(before) / (GREEDY_TOKENS * len(reference))


def decode_speed(engine: OfflineEngine) -> tuple[float, float]:
    """(wall, CPU-time) tok/s of one 128-token greedy decode after a 128-token prompt."""
    prompt = list(range(1000, 1128))
    engine.generate([prompt], [8])  # warm-up
    wall, cpu = time.perf_counter(), time.thread_time()
    engine.generate([prompt], [128])
    return 128 / (time.perf_counter() - wall), 128 / (time.thread_time() - cpu)


def llama_cpp_answer(path: Path, ids: list[int], text, threads: int) -> str:
    """llama.cpp on the same GGUF: the first token's four best candidates and the greedy answer."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=512, n_threads=threads, logits_all=True, verbose=False)
    llm.eval(ids)
    logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    first = ", ".join(
        f"{text.decode([int(t)])!r} {logprobs[t]:.2f}" for t in np.argsort(-logprobs)[:4]
    )
    answer = []
    for _ in range(GREEDY_TOKENS):
        answer.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([answer[-1]])
    return f"{first} | {text.decode(answer, skip_special_tokens=True).split(chr(10))[0][:48]!r}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--settings",
        nargs="+",
        default=["float32:none", "float32:gguf", "bfloat16:gguf", "bfloat16:none"],
        help="dtype:quantization[:kv cache dtype] (quantization gguf/Q4_K: only that GGUF type "
        "kept); the first is the reference",
    )
    p.add_argument("--llama-cpp", action="store_true", help="llama.cpp's answer too")
    p.add_argument(
        "--model", type=Path, default=None, help="a GGUF file (default: the packaged SmolLM2)"
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or default_path()
    text = load_gguf_text_model(path)
    words = TEXT.read_text().split()
    prompts = [text.encode(" ".join(words[i * 25 : i * 25 + 40])) for i in range(16)]
    prompts += [text.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    print(f"{path.name}; load average at start: {load_average()}; threads {args.threads}")
    engines = {setting: build(setting, path) for setting in args.settings}
    greedy = {}
    for setting, engine in engines.items():
        out = engine.generate([list(p) for p in prompts], [GREEDY_TOKENS] * len(prompts))
        greedy[setting] = [out[f"r{i}"] for i in range(len(prompts))]
    speeds: dict[str, list[tuple[float, float]]] = {s: [] for s in engines}
    for _ in range(args.reps):
        for setting, engine in engines.items():
            speeds[setting].append(decode_speed(engine))
    reference = greedy[args.settings[0]]
    print(
        "| setting | greedy exact (of 24) | tokens before divergence | batch-1 tok/s (wall) "
        "| batch-1 tok/s (CPU time) | README question: first token | greedy answer |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for setting, engine in engines.items():
        exact, share = agreement(reference, greedy[setting])
        wall = statistics.median(w for w, _ in speeds[setting])
        cpu = statistics.median(c for _, c in speeds[setting])
        first = first_token_candidates(engine, prompts[16], text)
        answer = text.decode(greedy[setting][16], skip_special_tokens=True).split("\n")[0]
        print(
            f"| {setting} | {exact} | {share:.1%} | {wall:.1f} | {cpu:.1f} | {first} "
            f"| {answer[:48]!r} |"
        )
    if args.llama_cpp:
        answer = llama_cpp_answer(path, prompts[16], text, args.threads)
        print(f"| llama.cpp (the file) | | | | | {answer} |")


if __name__ == "__main__":
    main()
