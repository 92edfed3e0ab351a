"""One request's way back to text: token ids in, deltas that are safe to show out.

Detokenizes incrementally (never half a UTF-8 character), applies stop strings (also across
token boundaries), and counts tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.tokenizer.detokenizer import IncrementalDetokenizer
from services.tokenizer.stop import StopChecker
from services.tokenizer.text_model import TextModel


@dataclass(slots=True)
class TextDelta:
    text: str
    stopped: bool  # a stop string ended generation here


@dataclass(slots=True)
class TextStream:
    model: TextModel
    detokenizer: IncrementalDetokenizer
    stop: StopChecker
    prompt_tokens: int
    completion_tokens: int = 0
    finished: bool = field(default=False)

    @classmethod
    def create(
        cls, model: TextModel, prompt_ids: list[int], stop: list[str], skip_special_tokens: bool
    ) -> TextStream:
        detok = IncrementalDetokenizer(model, prompt_ids, skip_special_tokens)
        return cls(model, detok, StopChecker(stop), len(prompt_ids))

    def add(self, token_ids: list[int], last: bool) -> TextDelta:
        """Text for newly generated ids. `last`: the scheduler ended the request here."""
        self.completion_tokens += len(token_ids)
        text = self.detokenizer.add(token_ids)
        if last:
            text += self.detokenizer.flush()
        emit, stopped = self.stop.feed(text)
        if last and not stopped:
            emit += self.stop.flush()
        self.finished = last or stopped
        return TextDelta(emit, stopped)
