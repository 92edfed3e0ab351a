"""Tool calls: the prompt a model's family expects, and the calls read back out of its text."""

from __future__ import annotations

import json

import pytest

from services.tokenizer.chat_template import ChatTemplate
from services.tokenizer.text_model import TextModel
from services.tokenizer.tool_format import FORMATS, choose_tool_format
from services.tokenizer.tool_parser import JsonToolCallParser, TaggedToolCallParser

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _feed_in_pieces(parser, text: str, size: int):
    content, calls = "", []
    for i in range(0, len(text), size):
        out = parser.feed(text[i : i + size])
        content, calls = content + out.content, calls + out.tool_calls
    out = parser.flush()
    return content + out.content, calls + out.tool_calls


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_tagged_calls_are_found_across_any_split(size: int) -> None:
    text = (
        'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call><tool_call>[{"name": "a", "arguments": {}}, {"name": "b", '
        '"parameters": {"x": 1}}]</tool_call> done <tool'
    )
    content, calls = _feed_in_pieces(TaggedToolCallParser(), text, size)
    assert content == "Let me check.  done <tool"
    assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == [
        (0, "get_weather", {"city": "Paris"}),
        (1, "a", {}),
        (2, "b", {"x": 1}),
    ]
    assert all(c.id.startswith("call_") for c in calls) and len({c.id for c in calls}) == 3


def test_a_tag_that_holds_no_call_stays_content() -> None:
    content, calls = _feed_in_pieces(TaggedToolCallParser(), "x <tool_call>not json</tool_call>", 4)
    assert (content, calls) == ("x <tool_call>not json</tool_call>", [])
    content, calls = _feed_in_pieces(TaggedToolCallParser(), "<tool_call>[]</tool_call>", 4)
    assert (content, calls) == ("", [])  # SmolLM2's "no tool fits"


def test_an_unclosed_tag_counts_when_its_call_is_complete() -> None:
    content, calls = _feed_in_pieces(
        TaggedToolCallParser(), '<tool_call>{"name": "f", "arguments": {"a": "}"}}', 5
    )
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("f", '{"a": "}"}')]


def test_json_calls_stream_as_each_object_closes() -> None:
    parser = JsonToolCallParser()
    first = parser.feed('[{"name":"f","arguments":{"s":"}{[\\"]"}},')
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [("f", {"s": '}{["]'})]
    second = parser.feed('{"name":"g","arguments":{}}]')
    assert [(c.index, c.name) for c in second.tool_calls] == [(1, "g")]
    assert parser.flush().content == ""
    single = JsonToolCallParser()
    assert [c.name for c in single.feed('{"name":"h","arguments":{"n":[1,{}]}}').tool_calls] == [
        "h"
    ]


def test_smollm2_family_is_chosen_for_the_default_model(smollm: TextModel) -> None:
    assert not smollm.template_renders_tools  # its template ignores tools
    source = smollm.chat_template.source
    assert choose_tool_format("auto", smollm.name, source).name == "smollm2"
    assert choose_tool_format("auto", "qwen2.5", "{{ tools }}").name == "hermes"
    assert choose_tool_format("hermes", smollm.name, source).name == "hermes"


def test_tools_and_history_are_written_the_way_smollm2_was_trained(smollm: TextModel) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            ],
        },
        {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1"},
    ]
    prompt = smollm.apply_chat_template(messages, True, [WEATHER], FORMATS["smollm2"])
    assert prompt.startswith("<|im_start|>system\nYou are an expert in composing functions.")
    assert '<tools>[{"name": "get_weather", "description": "Current weather' in prompt
    assert (
        '<|im_start|>assistant\n<tool_call>[{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}]</tool_call><|im_end|>'
    ) in prompt
    assert '<|im_start|>tool\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_template_that_renders_tools_gets_them_as_transformers_passes_them() -> None:
    source = (
        "{% if tools %}TOOLS:{{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.name }}"
        "{{ c.function.arguments | tojson }}]{% endfor %}\n{% endfor %}"
    )
    model_template = ChatTemplate(source)
    assert model_template.renders_tools()
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
        },
    ]
    text = model_template.render(messages, True, [WEATHER])
    assert text.startswith('TOOLS:[{"type": "function", "function": {"name": "get_weather"')
    assert 'assistant:[f{"a": 1}]' in text
