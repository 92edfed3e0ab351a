"""What the gateway's front ends (OpenAI HTTP, public gRPC) ask of the stack behind them.

`TokenizerBackend` (tokenizer_client.py) implements `Backend` over the tokenizer service's
multiplexed session stream. Errors come out as services.common.errors.LayerserveError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions


@dataclass(slots=True)
class ToolCall:
    """A function call: in an assistant turn of the history, or found in generated text
    (`index` then numbers it among the choice's calls)."""

    id: str
    name: str
    arguments: str  # a JSON object, as text
    index: int = 0


@dataclass(slots=True)
class Tool:
    """A function the model may call."""

    name: str
    description: str = ""
    parameters: str = ""  # a JSON schema of an object, as text; "" = no parameters


@dataclass(slots=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)  # an assistant turn's calls
    tool_call_id: str = ""  # a tool turn: the call it answers
    name: str = ""  # a tool turn: the function's name, when given


# The sampling fields a model may recommend values for (README "Model defaults").
MODEL_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(slots=True)
class GenerationRequest:
    """One completion. Exactly one of prompt, messages, prompt_token_ids is set."""

    request_id: str
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    prompt_token_ids: list[int] | None = None
    add_generation_prompt: bool = True
    # The client's own limit (strict: refused when it does not fit) or the gateway's default
    # (a cap admission lowers to what fits): services/common/max_tokens.py.
    max_tokens: MaxTokens = MaxTokens()
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    # Fields of MODEL_DEFAULT_FIELDS the client left out: the tokenizer sets each to the
    # serving model's recommended value, where it has one (else `sampling`'s stays).
    sampling_unset: tuple[str, ...] = ()
    # Completions' echo: the response starts with the prompt (and, with sampling.prompt_logprobs,
    # the prompt tokens' logprobs).
    echo: bool = False
    # POST /v1/embeddings: the prompt pooled as the model says (GenerationDelta.embedding).
    embed: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    priority: int = 0
    trace_context: dict[str, str] = field(default_factory=dict)
    tenant: str = ""  # non-secret id of the caller's API key (ApiKey.tenant)
    max_prompt_tokens: int = 0  # the gateway's limit; 0: the model's context length
    # The field sampling.structured came from, as the client spelled it (for errors).
    structured_param: str = "response_format"
    tools: list[Tool] = field(default_factory=list)
    # "none" | "auto" | "required" ("" until validated: auto with tools, none without).
    tool_choice: str = ""
    tool_choice_function: str = ""  # a named function: exactly this one is called
    parallel_tool_calls: bool = True


@dataclass(slots=True)
class TopLogprob:
    token: str
    token_bytes: bytes
    logprob: float


@dataclass(slots=True)
class TokenLogprob:
    token: str
    token_bytes: bytes
    logprob: float | None  # None: the prompt's first token, which nothing predicts
    top: list[TopLogprob] = field(default_factory=list)


@dataclass(slots=True)
class GenerationDelta:
    """What a request produced since the previous delta. The last one has finish_reason set."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None  # parallel to token_ids when asked for
    finish_reason: str | None = None  # "stop" | "length" on the last delta (see tool_calls)
    prompt_tokens: int = 0
    completion_tokens: int = 0  # total so far
    cached_tokens: int = 0
    model: str = ""  # the model that serves the request (an alias's target); "" = not said
    tool_calls: list[ToolCall] = field(default_factory=list)  # completed since the last delta
    # On the first delta only: the prompt's text (a request with echo and a token-id prompt),
    # and its tokens' logprobs (sampling.prompt_logprobs; the first token's logprob None).
    prompt_text: str | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    embedding: list[float] | None = None  # an embedding request's vector, on its first delta
    stop_sequence: str | None = None  # on the last delta: the stop string that ended it


@dataclass(slots=True)
class ModelCard:
    id: str
    max_model_len: int
    created: int = 0
    owned_by: str = "layerserve"


class Backend(Protocol):
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Streams deltas. Raises LayerserveError on failure; closing the iterator early (the
        client went away) aborts the request and frees its resources."""
        ...

    async def list_models(self) -> list[ModelCard]: ...
