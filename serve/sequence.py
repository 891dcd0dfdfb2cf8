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


@dataclass(frozen=True)
class TokenLogprobs:
    """A sampled token's log-probability and the top k tokens' (id, log-probability)."""
    logprob: float
    top: tuple  # the likeliest first

    @classmethod
    def of_row(cls, values: list, token_ids: list, k: int) -> "TokenLogprobs":
        """From a row of SampledLogprobs on the host, cut to the k its sequence asked."""
        return cls(values[0], tuple(zip(token_ids[1:1 + k], values[1:1 + k])))


@dataclass
class SequenceOutput:
    """What one step added to a sequence, as its request's handler receives it."""
    index: int  # the sample this sequence is, over all of its request's prompts
    text: str
    token_ids: list
    finish_reason: Optional[str]  # "stop", "length", or None while it runs
    logprobs: Optional[list] = None  # TokenLogprobs of token_ids, when asked for


@dataclass(eq=False)
class Sequence:
    prompt_token_ids: list
    params: SamplingParams
    tokenizer: Tokenizer
    outbox: asyncio.Queue  # SequenceOutput (or the exception that ended the server's loop)
    index: int = 0
    seq_id: int = field(default_factory=lambda: next(SEQUENCE_IDS))  # the engine's request id
    output_token_ids: list = field(default_factory=list)
    output_logprobs: list = field(default_factory=list)  # TokenLogprobs, when asked for
    cumulative_logprob: float = 0.0
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

    @property
    def mean_logprob(self) -> float:
        """What best_of ranks samples by (their log-probabilities must have been asked for)."""
        return self.cumulative_logprob / max(len(self.output_token_ids), 1)

    def append(self, token_id: int, logprobs: Optional[TokenLogprobs] = None) -> None:
        """Take one sampled token (and its log-probabilities, when asked for) and say at
        once whether it ends the sequence (EOS or max_tokens), so that the next step is
        scheduled without it."""
        self.output_token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
            self.cumulative_logprob += logprobs.logprob
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
        return SequenceOutput(self.index, text, self.output_token_ids[-1:], self.finish_reason,
                              self.output_logprobs[-1:] if self.output_logprobs else None)
