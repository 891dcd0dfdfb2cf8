"""One sequence's state in the engine core: its tokens, its limits, where it stands.

Its text, stop strings and outbox are the API process's (serve.output_processor): the core
sees token ids only.
"""
from dataclasses import dataclass, field
from enum import Enum, auto
from itertools import count
from typing import Optional

from serve.sampling import SamplingParams

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


@dataclass(eq=False)
class Sequence:
    prompt_token_ids: list
    params: SamplingParams
    seq_id: int = field(default_factory=lambda: next(SEQUENCE_IDS))  # the engine's request id
    eos_token_id: Optional[int] = None
    output_token_ids: list = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: Optional[str] = None
    generator: object = None  # the request's own torch.Generator when it has a seed

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
        if token_id == self.eos_token_id and not self.params.ignore_eos:
            self.finish_reason = "stop"
        elif len(self.output_token_ids) >= self.params.max_tokens:
            self.finish_reason = "length"
