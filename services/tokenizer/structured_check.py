"""The tokenizer's check of a request's output constraint: a grammar that does not compile for
the target model's vocabulary is refused with INVALID_ARGUMENT before anything is scheduled
(the worker would otherwise fail the request after its prefill)."""

from __future__ import annotations

import threading
from weakref import WeakKeyDictionary

from llguidance import LLTokenizer

from layerserve.common.v1 import common_pb2
from services.common.sampling import StructuredOutput
from services.common.sampling_proto import structured_from_proto
from services.common.structured_output import check_structured, grammar_tokenizer
from services.tokenizer.text_model import TextModel

# The client field each kind comes from (OpenAI response_format, vLLM's guided_* extensions),
# named in the error.
PARAMS = {
    "json_schema": "response_format",
    "json_object": "response_format",
    "regex": "guided_regex",
    "choice": "guided_choice",
    "grammar": "guided_grammar",
}

_tokenizers: WeakKeyDictionary[TextModel, LLTokenizer] = WeakKeyDictionary()
_lock = threading.Lock()


def structured_of(sampling: common_pb2.SamplingParams) -> StructuredOutput | None:
    if not sampling.HasField("structured"):
        return None
    return structured_from_proto(sampling.structured)


def check_request_structured(model: TextModel, structured: StructuredOutput) -> None:
    """Raises InvalidArgument when the constraint does not compile. Blocks ~0.5 s the first
    time per model (the vocabulary), ~1 ms after: run it in a thread pool."""
    param = PARAMS.get(structured.kind, "structured")
    check_structured(structured, _grammar_tokenizer(model), param)


def _grammar_tokenizer(model: TextModel) -> LLTokenizer:
    with _lock:
        found = _tokenizers.get(model)
        if found is None:
            eos = [model.eos_token_id] if model.eos_token_id is not None else []
            found = grammar_tokenizer(model.tokenizer.to_str(), eos, model.vocab_size)
            _tokenizers[model] = found
        return found
