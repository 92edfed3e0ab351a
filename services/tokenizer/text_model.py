"""TextModel: one model's tokenizer, chat template and special tokens, as the service uses them.

Both loaders (GGUF metadata, Hugging Face directory) produce this class, so everything above
them is format-agnostic. It is plain synchronous code: the gRPC server runs `encode` in a
thread pool. Encoding goes through `Tokenizer.encode_batch_fast`, which releases the GIL while
the Rust code runs (plain `Tokenizer.encode` does not), so a long prompt does not stall the
event loop or other threads. Every method is safe to call from many threads at once: the
Rust tokenizer is immutable after construction and so is everything stored here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer

from services.common.errors import InvalidArgument
from services.common.sampling import Pooling
from services.tokenizer.chat_template import ChatTemplate, Message
from services.tokenizer.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from services.tokenizer.tool_format import ToolFormat
from services.tokenizer.vocab_bytes import build_token_bytes, is_byte_level

# End-of-turn markers of common chat formats (ChatML, GPT-2, Llama 3, Gemma). A model that
# emits one of them has finished its turn even when its metadata names another token as EOS.
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


class TextModel:
    """A model's tokenizer.

    Contracts:
    * `encode(text)` applies the tokenizer's own post-processor, which is where the BOS rule
      lives (see the loaders); `encode_chat` never adds special tokens itself, because chat
      templates write their own (Hugging Face's apply_chat_template(tokenize=True) does the
      same).
    * `decode` and `token_bytes` agree: for byte-level tokenizers, decoding the concatenated
      `token_bytes` of a sequence as UTF-8 with replacement equals `decode(ids)`.
    * Ids outside the vocabulary raise InvalidArgument rather than being silently dropped.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        name: str,
        bos_token_id: int | None,
        eos_token_id: int | None,
        chat_template: str | None,
        extra_stop_token_ids: Iterable[int] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self.name = name
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self._token_bytes = build_token_bytes(tokenizer)
        self.vocab_size = len(self._token_bytes)
        self.is_byte_level = is_byte_level(tokenizer)
        self.special_token_ids = frozenset(
            i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special
        )
        self.stop_token_ids = self._collect_stop_ids(extra_stop_token_ids)
        # The model's recommended sampling settings (set by the loader; none by default).
        self.sampling_defaults: SamplingDefaults = NO_DEFAULTS
        # How its embeddings are pooled (set by the loader: pooling_choice.py).
        self.pooling: Pooling = "last"
        self.chat_template: ChatTemplate | None = None
        self.template_renders_tools = False
        if chat_template:
            self.chat_template = ChatTemplate(
                chat_template,
                bos_token=self._token_string(bos_token_id),
                eos_token=self._token_string(eos_token_id),
            )
            self.template_renders_tools = self.chat_template.renders_tools()

    @property
    def tokenizer(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (read-only use; it is shared)."""
        return self._tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` lets the post-processor add BOS."""
        # encode_batch_fast releases the GIL and skips offset bookkeeping we never use.
        encoding = self._tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return encoding[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`; special tokens are dropped when `skip_special_tokens`."""
        self.validate_ids(ids)
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[Message] | None = None,
        tool_format: ToolFormat | None = None,
    ) -> str:
        """The model's prompt text for a conversation. InvalidArgument when the model has no
        chat template, the messages are malformed, or the template rejects them. A template
        that ignores tools gets them, and the history's calls and results, as `tool_format`
        writes them (tool_format.py)."""
        if self.chat_template is None:
            raise InvalidArgument(f"model {self.name!r} has no chat template", param="messages")
        if tool_format is not None and not self.template_renders_tools:
            messages, tools = tool_format.prepare(messages, tools or ()), None
        return self.chat_template.render(messages, add_generation_prompt, tools)

    def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[Message] | None = None,
        tool_format: ToolFormat | None = None,
    ) -> list[int]:
        """Token ids of the rendered conversation, with no special tokens added on top."""
        text = self.apply_chat_template(messages, add_generation_prompt, tools, tool_format)
        return self.encode(text, add_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token `token_id` stands for; may be part of a UTF-8 character."""
        self.validate_ids((token_id,))
        return self._token_bytes[token_id]

    def token_text(self, token_id: int) -> str:
        """The token's text for display (logprobs). A token holding part of a UTF-8
        character shows U+FFFD, as OpenAI's API does; `token_bytes` has the exact bytes."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def token_id(self, token: str) -> int | None:
        """The id of a vocabulary entry spelled exactly `token`, or None."""
        return self._tokenizer.token_to_id(token)

    def validate_ids(self, ids: Sequence[int]) -> None:
        """InvalidArgument naming the first id outside the vocabulary (O(n), no decoding)."""
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            # Not named: self.name is the file's or folder's, not the served name.
            raise InvalidArgument(
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size})"
            )

    def _token_string(self, token_id: int | None) -> str:
        """What a template sees as bos_token/eos_token: the token's spelling, or ""."""
        if token_id is None:
            return ""
        return self._tokenizer.id_to_token(token_id) or ""

    def _collect_stop_ids(self, extra: Iterable[int]) -> frozenset[int]:
        ids = set(extra)
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        for token in _END_OF_TURN_TOKENS:
            token_id = self._tokenizer.token_to_id(token)
            if token_id is not None:
                ids.add(token_id)
        return frozenset(ids)
