"""A model's own Jinja chat template, rendered the way Hugging Face transformers renders it.

The template is untrusted text shipped with a model file, so it runs in Jinja's immutable
sandbox: it can read the messages but cannot call arbitrary attributes or mutate its inputs.
The environment mirrors transformers' `_compile_jinja_template` (trim_blocks, lstrip_blocks,
loop controls, `raise_exception`, `strftime_now`, a non-ASCII-escaping `tojson`) so that a
template written for transformers renders byte-for-byte the same here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from services.common.errors import InvalidArgument

Message = Mapping[str, Any]  # role, content; tool_calls, tool_call_id, name when set


def _raise_exception(message: str) -> None:
    """Templates call this to reject a conversation (e.g. roles that do not alternate)."""
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' tojson: Jinja's built-in one HTML-escapes and ASCII-escapes, which would
    change the prompt the model was trained on."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    """Some templates (Llama 3.x) stamp today's date into the system prompt."""
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference.

    Construction raises ValueError when the template does not compile (a broken model file is
    an operator problem, found at startup). `render` raises InvalidArgument when the messages
    are malformed or the template rejects them (a client problem, reported per request).
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[Message] | None = None,
    ) -> str:
        """The prompt text for `messages`, ending with the assistant header when
        `add_generation_prompt` is true and the template supports it. `tools`: OpenAI's
        `[{"type": "function", "function": {...}}]`, passed as transformers passes them."""
        _validate_messages(messages)
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except jinja2.TemplateError as exc:
            # Covers raise_exception, sandbox violations and undefined lookups alike: all of
            # them mean this conversation cannot be rendered by this model's template.
            raise InvalidArgument(f"chat template rejected the messages: {exc}") from exc

    def renders_tools(self) -> bool:
        """Whether the template writes `tools` into the prompt at all (many, like SmolLM2's,
        ignore them): a probe conversation rendered with and without one tool."""
        probe = [{"role": "user", "content": "probe"}]
        tool = {"type": "function", "function": {"name": "probe_tool", "parameters": {}}}
        try:
            return self.render(probe, True, [tool]) != self.render(probe, True)
        except InvalidArgument:
            return False


def _validate_messages(messages: Sequence[Message]) -> None:
    """Every message needs string `role` and `content`; templates index them blindly and
    would otherwise fail with confusing TypeErrors outside Jinja's error hierarchy."""
    if not messages:
        raise InvalidArgument("messages must not be empty", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidArgument(f"messages[{i}] must be an object", param="messages")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise InvalidArgument(
                    f"messages[{i}].{key} must be a string", param=f"messages[{i}].{key}"
                )
