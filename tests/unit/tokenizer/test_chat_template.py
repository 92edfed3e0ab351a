"""Chat templates: SmolLM2's own template, and the sandboxed environment's HF semantics."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.tokenizer.chat_template import ChatTemplate
from services.tokenizer.text_model import TextModel

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n"
)


def test_default_system_prompt(smollm: TextModel) -> None:
    assert smollm.apply_chat_template(QUESTION) == (
        DEFAULT_SYSTEM
        + "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        + "<|im_start|>assistant\n"
    )


def test_given_system_message_replaces_default(smollm: TextModel) -> None:
    messages = [{"role": "system", "content": "Be terse."}, *QUESTION]
    assert smollm.apply_chat_template(messages) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_without_generation_prompt(smollm: TextModel) -> None:
    text = smollm.apply_chat_template(QUESTION, add_generation_prompt=False)
    assert text.endswith("France?<|im_end|>\n")


def test_encode_chat_uses_special_ids_and_adds_nothing(smollm: TextModel) -> None:
    ids = smollm.encode_chat(QUESTION)
    assert ids[0] == 1  # <|im_start|>, written by the template, not a BOS we added
    assert ids.count(1) == 3 and ids.count(2) == 2
    assert smollm.decode(ids) == smollm.apply_chat_template(QUESTION)


@pytest.mark.parametrize(
    "messages",
    [[], [{"role": "user"}], [{"role": "user", "content": None}], ["hello"]],
)
def test_malformed_messages(smollm: TextModel, messages: list) -> None:
    with pytest.raises(InvalidArgument):
        smollm.apply_chat_template(messages)


def test_raise_exception_becomes_invalid_argument() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    with pytest.raises(InvalidArgument, match="user first"):
        template.render([{"role": "assistant", "content": "hi"}])


def test_hf_environment_semantics() -> None:
    # trim_blocks/lstrip_blocks, loop controls, bos/eos variables and a tojson that keeps
    # non-ASCII text: the same output transformers would produce.
    source = (
        "{{ bos_token }}\n"
        "  {% for m in messages %}\n"
        "    {% if loop.index > 1 %}{% break %}{% endif %}\n"
        "{{ m | tojson }}{{ eos_token }}\n"
        "  {% endfor %}\n"
    )
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    rendered = template.render([{"role": "user", "content": "né"}, QUESTION[0]])
    assert rendered == '<s>\n{"role": "user", "content": "né"}</s>\n'


def test_sandbox_blocks_unsafe_access() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(InvalidArgument):
        template.render(QUESTION)


def test_template_that_does_not_compile() -> None:
    with pytest.raises(ValueError):
        ChatTemplate("{% for m in messages %}")
