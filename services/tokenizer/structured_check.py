"""The tokenizer's check of a request's output constraint: a grammar that does not compile for
the target model's vocabulary is refused with INVALID_ARGUMENT before anything is scheduled
(the worker would otherwise fail the request after its prefill)."""

from __future__ import annotations

import itertools
import threading
from weakref import WeakKeyDictionary

from layerserve.common.v1 import common_pb2
from services.common.grammar_pool import Vocabulary, grammar_pool
from services.common.sampling import StructuredOutput
from services.common.sampling_proto import structured_from_proto
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

_vocabularies: WeakKeyDictionary[TextModel, Vocabulary] = WeakKeyDictionary()
_keys = itertools.count()
_lock = threading.Lock()


def structured_of(sampling: common_pb2.SamplingParams) -> StructuredOutput | None:
    if not sampling.HasField("structured"):
        return None
    return structured_from_proto(sampling.structured)


def check_request_structured(model: TextModel, structured: StructuredOutput) -> None:
    """Raises InvalidArgument when the constraint is over a limit or does not compile for the
    model's vocabulary. Checked in a grammar process (grammar_pool.py: a grammar that crashes
    llguidance costs that process, not this service), which loads the vocabulary the first time
    (~1 s); ~1 ms after. Blocks up to the grammar time budget: run it in a thread pool."""
    param = PARAMS.get(structured.kind, "structured")
    grammar_pool().check(structured, param, _vocabulary(model))


async def check_structured_async(model: TextModel, structured: StructuredOutput) -> None:
    """check_request_structured, awaited: the grammar pool's own threads wait for the grammar
    process, not the threads that tokenize prompts."""
    param = PARAMS.get(structured.kind, "structured")
    await grammar_pool().check_async(structured, param, _vocabulary(model))


def _vocabulary(model: TextModel) -> Vocabulary:
    with _lock:
        found = _vocabularies.get(model)
        if found is None:
            eos = [model.eos_token_id] if model.eos_token_id is not None else []
            found = Vocabulary(next(_keys), model.tokenizer.to_str, eos, model.vocab_size)
            _vocabularies[model] = found
        return found
