"""LoadedModel: what a loader returns, apart from the loaders so that code running a model
(the runner, the GPU check) does not import the weight-format packages (gguf, safetensors)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.worker.model.bert import BertModel
    from services.worker.model.bert_config import BertConfig
    from services.worker.model.config import LlamaConfig
    from services.worker.model.gemma3 import Gemma3Model
    from services.worker.model.llama import LlamaModel


@dataclass(frozen=True, slots=True)
class LoadedModel:
    # Gemma 3's config subclasses LlamaConfig: the runner and the KV cache read shared fields.
    # BERT's (an encoder, run by engine/encoder_runner.py) names alike the fields it shares.
    config: LlamaConfig | BertConfig
    model: LlamaModel | Gemma3Model | BertModel  # the network registry.py chose from its metadata
    fingerprint: str  # sha256 hex of headers, sizes and sampled weight bytes
    path: Path
