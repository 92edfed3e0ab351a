"""A GenerateRequest's chat with tools, in the shapes chat templates and tool parsers take.

Messages and tools become the dicts Hugging Face's apply_chat_template takes (`tool_calls`
with `arguments` as an object, `tools` as `[{"type": "function", "function": {...}}]`), and
the request's tool_call_parsing picks the parser its output goes through.
"""

from __future__ import annotations

import json
from typing import Any

from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common.errors import InvalidArgument
from services.tokenizer.text_model import TextModel
from services.tokenizer.tool_format import ToolFormat, choose_tool_format
from services.tokenizer.tool_parser import JsonToolCallParser, ToolCallParser


def chat_messages(chat: tokenizer_pb2.ChatMessages) -> list[dict[str, Any]]:
    messages = []
    for m in chat.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _json_or_text(c.arguments)},
                }
                for c in m.tool_calls
            ]
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.name:
            message["name"] = m.name
        messages.append(message)
    return messages


def chat_tools(request: tokenizer_pb2.GenerateRequest) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": _json_or_text(t.parameters) if t.parameters else {},
            },
        }
        for t in request.tools
    ]


def tool_format_of(setting: str, model: TextModel) -> ToolFormat:
    """The model's family's tool format; `setting` is --tool-parser."""
    template = model.chat_template.source if model.chat_template else ""
    return choose_tool_format(setting, model.name, template)


def tool_call_parser(parsing: int, tool_format: ToolFormat) -> ToolCallParser | None:
    """The parser for a request's tool_call_parsing; None: all text is content."""
    if parsing == tokenizer_pb2.TOOL_CALL_PARSING_MODEL_FORMAT:
        return tool_format.parser()
    if parsing == tokenizer_pb2.TOOL_CALL_PARSING_JSON:
        return JsonToolCallParser()
    return None


def _json_or_text(text: str) -> Any:
    """Templates want arguments as an object (they `tojson` them); text that is not JSON
    stays text rather than failing the request."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def tokenize(model: TextModel, msg, tool_parser: str = "auto") -> list[int]:
    """Prompt token ids of a GenerateRequest or TokenizeRequest (runs in a worker thread).
    tool_parser (--tool-parser) names how the model's family is told about tools."""
    which = msg.WhichOneof("input")
    if which == "chat":
        if model.chat_template is None:  # named as served, not as its file or folder is
            raise InvalidArgument(
                f"model {msg.model!r} has no chat template: a base model takes a prompt "
                "(/v1/completions), a sentence-embedding model text to /v1/embeddings",
                param="messages",
            )
        tools = chat_tools(msg) if isinstance(msg, tokenizer_pb2.GenerateRequest) else []
        return model.encode_chat(
            chat_messages(msg.chat),
            msg.chat.add_generation_prompt,
            tools,
            tool_format_of(tool_parser, model),
        )
    if which == "prompt_token_ids":
        ids = list(msg.prompt_token_ids.ids)
        model.validate_ids(ids)
        return ids
    return model.encode(msg.prompt)
