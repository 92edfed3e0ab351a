"""A request as a client submitted it, before routing and admission (server.py builds it from
scheduler.v1.Submit; admission.py checks it and makes the scheduler's Request)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions


@dataclass(frozen=True, slots=True)
class Submission:
    request_id: str
    model: str
    prompt_token_ids: list[int]
    max_tokens: MaxTokens = MaxTokens()  # unset: as many as fit
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    priority: int = 0
    tenant: str = ""  # non-secret id of the caller's API key; "" = anonymous
    trace_context: dict[str, str] = field(default_factory=dict)  # the caller's span (W3C)
    # The last this-many prompt_token_ids are output already produced (a request migrated
    # from a lost scheduler replica): they become the Request's first output tokens.
    resumed_output_tokens: int = 0
    migrations: int = 0  # moves made already, by any tier (Submit.migrations)
