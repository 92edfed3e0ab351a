"""Perplexity and top-1 agreement of each weight format against the float32 reference, on one
vendored text (issue 29: "Quality per format measured against the float reference (perplexity,
top-1 agreement) and recorded").

    PYTHONPATH=. .venv/bin/python -m benchmarks.perplexity [--models smollm2 gemma3]
        [--window 512] [--stride 256] [--chunk 16] [--threads 1] [--quick] [--json]

The text is benchmarks/data/constitution.txt (the US Constitution, public domain; provenance in
constitution.md beside it), 5,779 SmolLM2 tokens, read teacher-forced in windows of --window
tokens that start --stride apart. Each window scores only the tokens the one before did not
reach (the first scores all of its own), so every token after the first is scored once, with at
least window - stride tokens of context (256 of 512 by default). A window starts with BOS where
the model's tokenizer adds one, as a served prompt does.

The forward is the worker's: the model class load_model builds at --dtype, the weights
quantize_loaded makes for --quantization, the attention backend "auto" picks, and a paged KV
cache in the model's KV cache groups. A window is prefilled in steps of --chunk tokens (the
scheduler's chunked prefill), and the output head scores --chunk rows a call. The quantized
weights pick their kernel by the rows of a call (the C++ 4-bit op up to 256 rows, the Q8_0 op
up to 16, dequantize-then-GEMM above), so the chunk decides which kernels the figures speak
for: 16, the default, runs every product through the kernels a decode batch of up to 16
sequences runs, the ones that compute every generated token; 512 (one step per window, as the
scheduler's default 1024-token chunk prefills a 512-token prompt) runs the 4-bit weights as
dequantize-then-GEMM, the float32 reference's very GEMM on the same values.

Per setting, over the scored tokens: perplexity (exp of the mean NLL of the text's next token),
that mean NLL, how often the argmax is the text's token, top-1 agreement (the argmax equal to
the reference's), the mean KL divergence KL(reference || setting) in nats per token, and the
largest |difference| between the setting's and the reference's logprob of the text's token.

No float (unquantized) checkpoint ships for either model: the float reference is float32 dense,
the GGUF's stored values dequantized to float32. The kept 4-bit settings compute with those very
values; int8 and int4 re-quantize the dequantized floats (a second rounding, except that int4's
min/max per 32 columns lands back on Q4_1's own grid: SmolLM2's file values again). int8 and
int4 run on float32 activations, what --dtype auto gives them on a CPU without native
bfloat16."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.machine import load_average
from services.tokenizer.gguf_tokenizer import load_gguf_text_model
from services.worker.layers.attention import StepAttention
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.int4_weight import q4_op_available
from services.worker.layers.kv_cache import PagedKVCache, kv_cache_groups
from services.worker.model.loader import LoadedModel, default_path, load_model
from services.worker.model.packaged import packaged_path
from services.worker.model.quant import quantize_loaded, weight_bytes

TEXT = Path(__file__).parent / "data" / "constitution.txt"
CPU = torch.device("cpu")
BLOCK_SIZE = 16  # the worker's default
LOGIT_ROWS = 256  # at most, positions per output-head pass: Gemma's [256, V] float32 is 268 MB
DECODE_CHUNK = 16  # rows a call at most where every quantized kernel is its decode one
# --quick: the text's first tokens in short windows, for tests (seconds, not minutes).
QUICK_TOKENS, QUICK_WINDOW, QUICK_STRIDE = 320, 128, 64

# Per model: the GGUF file and its settings (dtype:quantization[:4-bit kernel], label), the
# reference first.
MODELS = {
    "smollm2": (
        default_path,
        (
            ("float32:none", "float32 dense (reference)"),
            ("bfloat16:none", "bfloat16 dense"),
            ("float32:gguf", "float32 + Q4_1 kept 4-bit (the CPU default)"),
            ("float32:gguf:int16act", "float32 + Q4_1 kept 4-bit, int16 activations (int16act)"),
            ("float32:gguf:int8act", "float32 + Q4_1 kept 4-bit, int8 activations (int8act)"),
            ("bfloat16:gguf", "bfloat16 + Q4_1 kept 4-bit"),
            ("float32:int8", "float32 + int8 from the float values"),
            ("float32:int4", "float32 + int4 from the float values"),
        ),
    ),
    "gemma3": (
        packaged_path,
        (
            ("float32:none", "float32 dense (reference)"),
            ("float32:gguf", "float32 + Q4_K kept 4-bit, Q5_0/Q8_0 int8 (the CPU default)"),
            ("float32:gguf:int16act", "float32 + Q4_K kept 4-bit, int16 activations (int16act)"),
            ("float32:gguf:int8act", "float32 + Q4_K kept 4-bit, int8 activations (int8act)"),
            ("bfloat16:none", "bfloat16 dense"),
        ),
    ),
}


@dataclass(slots=True)
class Scores:
    """One setting's sums over the scored positions, against the reference."""

    setting: str
    label: str
    weight_bytes: int
    positions: int = 0
    nll: float = 0.0  # sum of -log p(text token)
    text_top1: int = 0  # argmax == the text's token
    agree: int = 0  # argmax == the reference's argmax
    kl: float = 0.0  # sum of KL(reference || this), nats
    max_logprob_diff: float = 0.0  # max |log p(text token) - the reference's|

    def add(self, logprobs: torch.Tensor, reference: torch.Tensor, targets: torch.Tensor) -> None:
        """logprobs, reference [R, V]: this setting's and the reference's; targets [R]."""
        chosen = logprobs.gather(1, targets[:, None]).squeeze(1)
        ref_chosen = reference.gather(1, targets[:, None]).squeeze(1)
        top = logprobs.argmax(-1)
        self.positions += len(targets)
        self.nll -= float(chosen.sum())
        self.text_top1 += int((top == targets).sum())
        self.agree += int((top == reference.argmax(-1)).sum())
        self.kl += float((reference.exp() * (reference - logprobs)).sum())
        diff = float((chosen - ref_chosen).abs().max())
        self.max_logprob_diff = max(self.max_logprob_diff, diff)

    def summary(self) -> dict[str, float | int | str]:
        mean_nll = self.nll / self.positions
        return {
            "setting": self.setting,
            "label": self.label,
            "weight_bytes": self.weight_bytes,
            "positions": self.positions,
            "perplexity": math.exp(mean_nll),
            "mean_nll": mean_nll,
            "text_top1": self.text_top1 / self.positions,
            "top1_agreement": self.agree / self.positions,
            # KL >= 0; a setting equal to the reference to rounding can sum to -1e-9.
            "mean_kl": max(self.kl / self.positions, 0.0),
            "max_logprob_diff": self.max_logprob_diff,
        }


class WindowForward:
    """One setting's model run as the worker runs a prompt: a window prefilled through the
    paged KV cache (rewritten from block 0 for every window)."""

    def __init__(self, loaded: LoadedModel, max_len: int) -> None:
        self.model = loaded.model
        config = loaded.config
        groups = kv_cache_groups(config)
        per_group = -(-max_len // BLOCK_SIZE)
        dtype = self.model.embed_tokens.dtype
        self.cache = PagedKVCache(config, per_group * len(groups), BLOCK_SIZE, dtype, CPU, groups)
        # A block belongs to one group of one sequence: each group its own blocks.
        self.tables = [list(range(g * per_group, (g + 1) * per_group)) for g in range(len(groups))]
        self.backend = choose_attention_backend("auto", CPU, config.head_dim)

    @torch.inference_mode()
    def hidden(self, ids: list[int], chunk: int) -> torch.Tensor:
        """The final hidden states [T, d] of every position of `ids`, prefilled `chunk` tokens
        a step: each step attends to the steps before it through the cache."""
        out = []
        for start in range(0, len(ids), chunk):
            n = min(chunk, len(ids) - start)
            blocks = -(-(start + n) // BLOCK_SIZE)
            tables = [[table[:blocks]] for table in self.tables]
            attn = StepAttention.build([n], [start + n], tables, BLOCK_SIZE, CPU, self.backend)
            tokens = torch.tensor(ids[start : start + n])
            out.append(self.model(tokens, attn.positions, attn, self.cache))
        return torch.cat(out)

    @torch.inference_mode()
    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [R, d] -> next-token logprobs [R, V] float32, through the setting's head."""
        return torch.log_softmax(self.model.compute_logits(hidden), dim=-1)


def windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored token) of each window over tokens [0, num_tokens): the window
    reads tokens [begin, end) and scores tokens [first, end), each token after the first once."""
    if not 0 < stride <= window:
        raise ValueError(f"need 0 < stride <= window, got stride {stride}, window {window}")
    spans, begin, scored_to = [], 0, 1  # token 0 has no context: never scored
    while scored_to < num_tokens:
        end = min(begin + window, num_tokens)
        spans.append((begin, end, scored_to))
        scored_to, begin = end, begin + stride
    return spans


def load_setting(path: Path, setting: str) -> LoadedModel:
    """setting "dtype:quantization[:kernel]" loaded as the worker loads --dtype and
    --quantization; kernel: the 4-bit weights' (int4_weight.int4_kernel), "auto" if none."""
    dtype, method, *kernel = setting.split(":")
    loaded = load_model(path, dtype=getattr(torch, dtype), device=CPU)
    return quantize_loaded(loaded, method, *kernel)


def measure(
    path: Path,
    settings: list[tuple[str, str]],
    text: list[int],
    bos: list[int],
    window: int,
    stride: int,
    chunk: int = DECODE_CHUNK,
) -> list[Scores]:
    """Scores of each (setting, label) over `text`, the first setting the reference. Every
    model stays loaded: each window runs through all of them, so the reference's full
    distributions are compared position by position without being stored."""
    runs, scores = [], []
    for setting, label in settings:
        loaded = load_setting(path, setting)
        runs.append(WindowForward(loaded, len(bos) + window))
        scores.append(Scores(setting, label, weight_bytes(loaded.model)))
    spans = windows(len(text), window, stride)
    for done, (begin, end, first) in enumerate(spans):
        print(f"{path.name}: window {done + 1}/{len(spans)}", file=sys.stderr, flush=True)
        hiddens = [run.hidden(bos + text[begin:end], chunk) for run in runs]
        # Row r of the window's input (BOS first, if any) predicts text token begin + r + 1
        # - len(bos): the rows that predict tokens [first, end).
        rows = torch.arange(first, end) - begin - 1 + len(bos)
        targets = torch.tensor(text[first:end])
        per_pass = min(chunk, LOGIT_ROWS)
        for at in range(0, len(rows), per_pass):
            part = rows[at : at + per_pass]
            reference = runs[0].logprobs(hiddens[0][part])
            for i, (run, hidden, score) in enumerate(zip(runs, hiddens, scores, strict=True)):
                logprobs = reference if i == 0 else run.logprobs(hidden[part])
                score.add(logprobs, reference, targets[at : at + per_pass])
    return scores


def text_tokens(path: Path, quick: bool) -> tuple[list[int], list[int]]:
    """(the text's token ids, the BOS prefix the tokenizer adds to a prompt: [] or [bos])."""
    tokenizer = load_gguf_text_model(path)
    ids = tokenizer.encode(TEXT.read_text(), add_special_tokens=False)
    bos = tokenizer.encode("", add_special_tokens=True)
    return (ids[:QUICK_TOKENS] if quick else ids), bos


def table(model: str, path: Path, tokens: int, rows: list[dict]) -> str:
    reference = rows[0]
    lines = [
        f"{model} ({path.name}): {tokens} tokens, {rows[0]['positions']} scored; the reference"
        " is float32 dense, the GGUF's values dequantized (no float checkpoint ships)",
        "",
        "| setting | weights | perplexity | vs reference | mean NLL | top-1 = text "
        "| top-1 = reference | mean KL (nats) | max abs logprob diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        change = r["perplexity"] / reference["perplexity"] - 1
        lines.append(
            f"| {r['label']} | {r['weight_bytes'] / 2**20:.0f} MiB | {r['perplexity']:.3f} "
            f"| {change:+.2%} | {r['mean_nll']:.4f} | {r['text_top1']:.1%} "
            # .2g: the decode kernels' rounding (1e-10 nats) must not print as the reference's 0
            f"| {r['top1_agreement']:.2%} | {r['mean_kl']:.2g} | {r['max_logprob_diff']:.2g} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["smollm2", "gemma3"])
    p.add_argument("--window", type=int, default=512, help="tokens a window reads")
    p.add_argument("--stride", type=int, default=256, help="tokens between window starts")
    p.add_argument(
        "--chunk",
        type=int,
        default=DECODE_CHUNK,
        help="tokens a prefill step and rows an output-head call (16: the decode kernels)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"the first {QUICK_TOKENS} tokens, windows of {QUICK_WINDOW} every {QUICK_STRIDE}",
    )
    p.add_argument("--json", action="store_true", help="the raw numbers as JSON, no table")
    p.add_argument(
        "--settings",
        nargs="+",
        help="only these settings (dtype:quantization[:kernel]) beside the reference",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    window, stride = (QUICK_WINDOW, QUICK_STRIDE) if args.quick else (args.window, args.stride)
    report: dict = {
        "text": TEXT.name,
        "window": window,
        "stride": stride,
        "chunk": args.chunk,
        "threads": args.threads,
        # Without the C++ extension the worker attends with torch ops and a float32 model's
        # 4-bit weights compute with int4pack (bfloat16 zeros): other numbers than served.
        "cpp_extension": q4_op_available(),
        "load_average_start": load_average(),
        "models": {},
    }
    started = time.perf_counter()
    for model in args.models:
        find_path, settings = MODELS[model]
        if args.settings:
            settings = settings[:1] + tuple(s for s in settings[1:] if s[0] in args.settings)
        path = find_path()
        text, bos = text_tokens(path, args.quick)
        scores = measure(path, list(settings), text, bos, window, stride, args.chunk)
        rows = [score.summary() for score in scores]
        report["models"][model] = {"file": path.name, "tokens": len(text), "settings": rows}
        if not args.json:
            print(table(model, path, len(text), rows) + "\n", flush=True)
    report["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"windows of {window} tokens every {stride}, prefilled {args.chunk} a step; "
            f"{args.threads} thread(s); C++ extension "
            f"{'built' if report['cpp_extension'] else 'NOT built (not the served kernels)'}; "
            f"load average {report['load_average_start']} at the start; {report['seconds']} s"
        )


if __name__ == "__main__":
    main()
