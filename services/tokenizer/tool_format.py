"""How a model family writes tool calls, and how to tell it about tools when its chat template
does not (vLLM's tool parsers, per family; `--tool-parser`).

A chat template that renders `tools` (Qwen 2.5, Hermes, Llama 3.1, ...) gets them as Hugging
Face's apply_chat_template passes them, and the history as is. A template that ignores them
(SmolLM2's) gets what the family was trained on instead: the tool list in the system prompt,
past calls written into the assistant's text, tool results as `tool` turns.

Both families here write calls as JSON inside `<tool_call>` tags, so `TaggedToolCallParser`
reads either; they differ in the prompt and in one call per tag (Hermes) vs. one array of
calls (SmolLM2, from its model card's function-calling prompt).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.tokenizer.tool_parser import TaggedToolCallParser

Message = Mapping[str, Any]

_HERMES_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>{tools}</tools> For each function call return a json object with "
    "function name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>'
)
_SMOLLM2_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls "
    "to achieve the purpose. If none of the functions can be used, point it out and refuse to "
    "answer. If the given question lacks the parameters required by the function, also point "
    "it out.\n\nYou have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be "
    "included.\nThe example format is as follows. Please make sure the parameter type is "
    "correct. If no function call is needed, please make the tool calls an empty list '[]'.\n"
    '<tool_call>[\n{{"name": "func_name1", "arguments": {{"argument1": "value1", '
    '"argument2": "value2"}}}},\n... (more tool calls as required)\n]</tool_call>'
)


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    system_prompt: str  # "{tools}" stands for the JSON list of function signatures
    array_of_calls: bool  # one tag holding an array (SmolLM2), or one tag per call (Hermes)

    def parser(self) -> TaggedToolCallParser:
        return TaggedToolCallParser()

    def prepare(self, messages: Sequence[Message], tools: Sequence[Message]) -> list[dict]:
        """The conversation for a template that ignores tools: the tools in the system
        prompt, tool calls and results as plain text."""
        prepared = [self._plain(m) for m in messages]
        if not tools:
            return prepared
        functions = [t.get("function", t) for t in tools]
        prompt = self.system_prompt.format(tools=json.dumps(functions, ensure_ascii=False))
        if prepared and prepared[0]["role"] == "system":
            prepared[0]["content"] = f"{prepared[0]['content']}\n\n{prompt}"
        else:
            prepared.insert(0, {"role": "system", "content": prompt})
        return prepared

    def _plain(self, message: Message) -> dict:
        content = message.get("content") or ""
        if message["role"] == "tool":
            return {"role": "tool", "content": f"<tool_response>\n{content}\n</tool_response>"}
        calls = [_call_json(c) for c in message.get("tool_calls") or ()]
        if calls:
            content = (
                f"{content}\n{self._calls_text(calls)}" if content else self._calls_text(calls)
            )
        return {"role": message["role"], "content": content}

    def _calls_text(self, calls: list[dict]) -> str:
        if self.array_of_calls:
            return f"<tool_call>{json.dumps(calls, ensure_ascii=False)}</tool_call>"
        return "\n".join(
            f"<tool_call>\n{json.dumps(c, ensure_ascii=False)}\n</tool_call>" for c in calls
        )


def _call_json(call: Message) -> dict:
    function = call.get("function", call)
    return {"name": function.get("name"), "arguments": function.get("arguments")}


FORMATS = {
    "hermes": ToolFormat("hermes", _HERMES_PROMPT, array_of_calls=False),
    "smollm2": ToolFormat("smollm2", _SMOLLM2_PROMPT, array_of_calls=True),
}
TOOL_PARSER_CHOICES = ("auto", *FORMATS)


def choose_tool_format(setting: str, model_name: str, template_source: str) -> ToolFormat:
    """`setting` is --tool-parser: a family's name, or "auto" to tell the family from the
    model (SmolLM2 by its name or its template's default system prompt; Hermes otherwise,
    the format most open chat models with tool support share)."""
    if setting != "auto":
        return FORMATS[setting]
    if "smollm" in model_name.lower() or "SmolLM" in template_source:
        return FORMATS["smollm2"]
    return FORMATS["hermes"]
