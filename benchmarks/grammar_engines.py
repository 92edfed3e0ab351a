"""xgrammar vs llguidance for structured outputs (issue 19): which grammar engine to build on.

    PYTHONPATH=. .venv/bin/python -m benchmarks.grammar_engines [--batch 64] [--steps 32]

Both engines get the same tokenizer (SmolLM2's, 49,152 tokens) and the same JSON schemas: the
kind agents send (Pydantic models of the OpenAI SDK's `parse`, tool parameters), plus
`json_object`. Measured per engine, in one run:
- compile time of each schema with caching off (p50, p99, max over the set, 3 repeats each);
- the per-step token-mask time at a batch of --batch constrained sequences (every row a
  different schema, cycling through the set), walking each row along tokens its own mask
  allows (seeded), and the time to apply the masks to [batch, vocab] float32 logits.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field


class Address(BaseModel):
    street: str
    city: str
    postcode: str = Field(pattern=r"^[0-9A-Z -]{3,10}$")
    country: Literal["FR", "DE", "GB", "US", "JP"]


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=150)
    email: str | None = None
    addresses: list[Address]


class Weather(BaseModel):
    location: str
    unit: Literal["celsius", "fahrenheit"] = "celsius"
    days: int = Field(ge=1, le=14)


class LineItem(BaseModel):
    sku: str
    quantity: int
    unit_price: float


class Invoice(BaseModel):
    number: str
    customer: Person
    items: list[LineItem]
    paid: bool
    notes: list[str] = []


class Step(BaseModel):
    explanation: str
    output: str


class MathReasoning(BaseModel):
    steps: list[Step]
    final_answer: str


class Event(BaseModel):
    title: str
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    participants: list[str] = Field(max_length=8)
    location: str | None


class Issue(BaseModel):
    title: str
    body: str
    labels: list[Literal["bug", "feature", "docs", "question"]]
    priority: int = Field(ge=1, le=5)
    assignee: str | None


class Recipe(BaseModel):
    name: str
    servings: int
    ingredients: list[dict[str, str]]
    steps: list[str]
    vegetarian: bool


class SearchQuery(BaseModel):
    query: str
    filters: dict[str, Any]
    limit: int = 10
    sort: Literal["relevance", "date"] = "relevance"


def schemas() -> dict[str, dict[str, Any]]:
    models = [Address, Person, Weather, Invoice, MathReasoning, Event, Issue, Recipe, SearchQuery]
    found = {m.__name__: m.model_json_schema() for m in models}
    found["json_object"] = {"type": "object"}
    found["sentiment_enum"] = {"enum": ["positive", "negative", "neutral"]}
    return found


def hf_tokenizer():  # noqa: ANN201 (transformers' type)
    from transformers import PreTrainedTokenizerFast

    from services.tokenizer.loader import load_tokenizer

    return PreTrainedTokenizerFast(
        tokenizer_object=load_tokenizer().tokenizer, eos_token="<|im_end|>"
    )


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False, max_threads=1)
        self.vocab = vocab

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matchers(self, compiled: list[Any]) -> list[Any]:
        return [self.xgr.GrammarMatcher(c) for c in compiled]

    def bitmask(self, batch: int) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(batch, self.vocab)

    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, i)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matcher: Any, token: int) -> None:
        matcher.accept_token(token)
        if matcher.is_terminated():  # a finished row starts over, so every row stays busy
            matcher.reset()


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.llt = llguidance.torch
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)
        self.executor = llguidance.LLExecutor(num_threads=1)
        self.vocab = vocab

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return grammar

    def matchers(self, compiled: list[Any]) -> list[Any]:
        return [self.llg.LLMatcher(self.tokenizer, g) for g in compiled]

    def bitmask(self, batch: int) -> torch.Tensor:
        return self.llt.allocate_token_bitmask(batch, self.vocab)

    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.llt.fill_next_token_bitmask_par(
            self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask
        )

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.llt.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matcher: Any, token: int) -> None:
        matcher.consume_token(token)
        if matcher.is_stopped():
            matcher.reset()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def allowed(bitmask_row: torch.Tensor, vocab: int) -> list[int]:
    """The token ids a packed int32 bitmask row allows (bit b of word w = token 32w + b)."""
    bits = (bitmask_row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return [t for t in bits.flatten().nonzero().flatten().tolist() if t < vocab]


def measure(engine: Any, named: dict[str, dict[str, Any]], batch: int, steps: int) -> dict:
    compile_s = []
    for schema in named.values():
        for _ in range(3):
            start = time.perf_counter()
            engine.compile(schema)
            compile_s.append(time.perf_counter() - start)
    compiled = [engine.compile(s) for s in named.values()]
    matchers = engine.matchers([compiled[i % len(compiled)] for i in range(batch)])
    bitmask = engine.bitmask(batch)
    logits = torch.randn(batch, engine.vocab)
    rng = random.Random(0)
    fill_s, apply_s = [], []
    for _ in range(steps):
        start = time.perf_counter()
        engine.fill(matchers, bitmask)
        fill_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.apply(logits, bitmask)
        apply_s.append(time.perf_counter() - start)
        for i, matcher in enumerate(matchers):
            choices = allowed(bitmask[i], engine.vocab)
            if choices:
                engine.accept(matcher, rng.choice(choices))
    return {
        "engine": engine.name,
        "compile_p50_ms": 1e3 * statistics.median(compile_s),
        "compile_p99_ms": 1e3 * percentile(compile_s, 0.99),
        "compile_max_ms": 1e3 * max(compile_s),
        "mask_step_p50_ms": 1e3 * statistics.median(fill_s),
        "mask_step_p99_ms": 1e3 * percentile(fill_s, 0.99),
        "apply_p50_ms": 1e3 * statistics.median(apply_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = hf_tokenizer()
    vocab = 49152
    named = schemas()
    rows = [
        measure(cls(tokenizer, vocab), named, args.batch, args.steps)
        for cls in (XGrammar, LLGuidance)
    ]
    print(f"{len(named)} schemas, batch {args.batch}, {args.steps} steps, 1 thread")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + " --- |" * len(keys))
    for row in rows:
        cells = [row["engine"]] + [f"{row[k]:.3f}" for k in keys[1:]]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
