"""One request's state: its tokens, where it stands, and the text it has handed out."""
import asyncio
from dataclasses import dataclass, field
from enum import Enum, auto
from itertools import count
from typing import Optional

from serve.sampling import SamplingParams
from serve.tokenizer import StreamDecoder, Tokenizer

SEQUENCE_IDS = count()


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass
class SequenceOutput:
    """What one step added to a sequence, as its request's handler receives it."""
    index: int  # the choice this sequence answers
    text: str
    token_ids: list
    finish_reason: Optional[str]  # "stop", "length", or None while it runs


@dataclass(eq=False)
class Sequence:
    prompt_token_ids: list
    params: SamplingParams
    tokenizer: Tokenizer
    outbox: asyncio.Queue  # SequenceOutput (or the exception that ended the server's loop)
    index: int = 0
    seq_id: int = field(default_factory=lambda: next(SEQUENCE_IDS))  # the engine's request id
    output_token_ids: list = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: Optional[str] = None
    generator: object = None  # the request's own torch.Generator when it has a seed
    text: str = ""
    num_text_sent: int = 0

    def __post_init__(self):
        self.decoder = StreamDecoder(self.tokenizer)
        # While running, hold back text that may be the start of a stop string.
        self.held_back = max((len(s) for s in self.params.stop), default=1) - 1

    @property
    def max_num_tokens(self) -> int:
        """The K/V rows this sequence may come to need: admission reserves them."""
        return len(self.prompt_token_ids) + self.params.max_tokens

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def append(self, token_id: int) -> None:
        """Take one sampled token and say at once whether it ends the sequence (EOS or
        max_tokens), so that the next step is scheduled without it."""
        self.output_token_ids.append(token_id)
        if token_id == self.tokenizer.eos_token_id and not self.params.ignore_eos:
            self.finish_reason = "stop"
        elif len(self.output_token_ids) >= self.params.max_tokens:
            self.finish_reason = "length"

    def detokenize(self) -> SequenceOutput:
        """The text the newest token adds, for the request's handler; a stop string in it
        ends the sequence (finish_reason "stop")."""
        self.text += self.decoder.step(self.output_token_ids, is_last=self.finish_reason is not None)
        if self.truncate_at_stop_string():
            self.finish_reason = "stop"
        return self.output()

    def truncate_at_stop_string(self) -> bool:
        # The text handed out holds no stop string, nor the start of one (it was held back).
        if not self.params.stop:
            return False
        found = [i for i in (self.text.find(s, self.num_text_sent) for s in self.params.stop) if i >= 0]
        if found:
            self.text = self.text[:min(found)]
        return bool(found)

    def output(self) -> SequenceOutput:
        """The text not yet handed out (less what is held back) and the newest token."""
        end = len(self.text) if self.finish_reason else len(self.text) - self.held_back
        end = max(end, self.num_text_sent)
        text, self.num_text_sent = self.text[self.num_text_sent:end], end
        return SequenceOutput(self.index, text, self.output_token_ids[-1:], self.finish_reason)
