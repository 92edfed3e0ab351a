"""Sampling options shared by every hop, and their validation.

Their protobuf form is services/common/sampling_proto.py's, used by the servers: the worker's
compute path imports this module on a machine with no protobuf (the GPU check)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.common.errors import InvalidArgument

MAX_LOGPROBS = 20

Pooling = Literal["last", "mean"]
StructuredKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
STRUCTURED_KINDS: tuple[StructuredKind, ...] = (
    "json_schema",
    "json_object",
    "regex",
    "choice",
    "grammar",
)


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on what a request may generate (common.v1.StructuredOutput).

    kind "json_schema": value is the schema as JSON text; "json_object": value is ""; "regex":
    the pattern; "choice": a tuple of the allowed strings; "grammar": Lark or GBNF text.
    Frozen and hashable: the worker keys its compiled grammars by it."""

    kind: StructuredKind
    value: str | tuple[str, ...] = ""

    def validate(self) -> None:
        """Checks the shape (kind and value agree); whether the grammar compiles is
        services.common.structured_output.check_structured's job."""
        if self.kind not in STRUCTURED_KINDS:
            raise InvalidArgument(
                f"structured output kind must be one of {', '.join(STRUCTURED_KINDS)}, "
                f"got {self.kind!r}",
                param="structured",
            )
        if self.kind == "choice":
            ok = (
                isinstance(self.value, tuple)
                and len(self.value) > 0
                and all(isinstance(v, str) for v in self.value)
            )
            rule = "a non-empty list of strings"
        elif self.kind == "json_object":
            ok, rule = self.value == "", "empty"
        else:
            ok = isinstance(self.value, str) and self.value != ""
            rule = "a non-empty string"
        if not ok:
            raise InvalidArgument(
                f"structured output {self.kind} must be {rule}", param="structured"
            )


@dataclass(slots=True)
class SamplingOptions:
    """Zero values mean off; temperature 0 is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    # None: no logprobs. n >= 0: the sampled token's logprob and the n most likely alternatives.
    logprobs: int | None = None
    # None: no prompt logprobs. n >= 0: each prompt token's logprob after the first, computed
    # during prefill, and the n most likely alternatives at its position.
    prompt_logprobs: int | None = None
    # None: no embedding. "last" or "mean": the prompt's final hidden states pooled so,
    # L2-normalised, returned with the first token (embeddings).
    pooling: Pooling | None = None
    # None: unconstrained.
    structured: StructuredOutput | None = None

    def validate(self) -> None:
        """Raises InvalidArgument naming the first bad value."""
        checks = [
            (0.0 <= self.temperature <= 2.0, "temperature", "must be between 0 and 2"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k >= 0, "top_k", "must be >= 0 (0 disables it)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be between 0 and 1"),
            (0.0 < self.repetition_penalty <= 2.0, "repetition_penalty", "must be in (0, 2]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be between -2 and 2"),
            (
                -2.0 <= self.frequency_penalty <= 2.0,
                "frequency_penalty",
                "must be between -2 and 2",
            ),
            (self.seed is None or 0 <= self.seed < 2**63, "seed", "must be in [0, 2**63)"),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
                "logprobs",
                f"must be between 0 and {MAX_LOGPROBS}",
            ),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
                "prompt_logprobs",
                f"must be between 0 and {MAX_LOGPROBS}",
            ),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise InvalidArgument(f"{name} {rule}, got {getattr(self, name)!r}", param=name)
        if self.structured is not None:
            self.structured.validate()
