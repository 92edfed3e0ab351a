"""A request's grammars, checked before it is sent on: its output constraint (response_format,
guided_*, structured_outputs, a forced tool call, gRPC's sampling.structured) and every tool's
parameters schema. The limits and llguidance's compile run in the grammar processes
(services/common/grammar_pool.py), never on the event loop: a grammar that is too big, too
deep, too slow or that crashes the engine is a 400 (INVALID_ARGUMENT) naming its field, and
the gateway serves on.

Both front ends call it once the request is admitted, so a key over its limits gets its 429
without any grammar work. Checked here without the model's vocabulary; the tokenizer checks
again with it."""

from __future__ import annotations

from services.common.grammar_pool import GrammarPool, grammar_pool
from services.common.sampling import StructuredOutput
from services.gateway.backend import GenerationRequest


async def check_grammars(request: GenerationRequest, pool: GrammarPool | None = None) -> None:
    """Raises InvalidArgument naming the field of the first grammar refused."""
    pool = pool or grammar_pool()
    if request.sampling.structured is not None:
        await pool.check_async(request.sampling.structured, request.structured_param)
    for i, tool in enumerate(request.tools):
        if tool.parameters:
            parameters = StructuredOutput("json_schema", tool.parameters)
            await pool.check_async(parameters, f"tools[{i}].function.parameters")
