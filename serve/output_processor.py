"""The API process's side of a step: its tokens become text, stop strings end sequences,
and each request's handler gets what its sequences added (vLLM V1's OutputProcessor).

It runs while the engine core computes the next step, in another process: nothing here
delays a step.
"""
import asyncio
from dataclasses import dataclass, field
from typing import Optional

from serve.sampling import SamplingParams
from serve.sequence import SEQUENCE_IDS
from serve.tokenizer import Tokenizer


@dataclass
class SequenceOutput:
    """What one or more steps added to a sequence, as its request's handler receives it."""
    index: int  # the sample this sequence is, over all of its request's prompts
    text: str
    token_ids: list
    finish_reason: Optional[str]  # "stop", "length", or None while it runs
    logprobs: Optional[list] = None  # TokenLogprobs of token_ids, when asked for


@dataclass(eq=False)
class SequenceState:
    """One sequence as its request sees it: tokens, text, and what was handed out."""
    prompt_token_ids: list
    params: SamplingParams
    tokenizer: Tokenizer
    outbox: asyncio.Queue  # SequenceOutput (or the exception that stopped the engine)
    index: int = 0
    seq_id: int = field(default_factory=lambda: next(SEQUENCE_IDS))  # the engine's request id
    output_token_ids: list = field(default_factory=list)
    output_logprobs: list = field(default_factory=list)  # TokenLogprobs, when asked for
    cumulative_logprob: float = 0.0
    finish_reason: Optional[str] = None
    is_finished: bool = False  # ended, or its client left
    is_waiting: bool = True  # no token back yet: admission counts it as waiting
    text: str = ""
    num_text_sent: int = 0
    num_tokens_sent: int = 0

    def __post_init__(self):
        self.decoder = self.tokenizer.stream_decoder()
        # While running, hold back text that may be the start of a stop string.
        self.held_back = max((len(s) for s in self.params.stop), default=1) - 1

    @property
    def mean_logprob(self) -> float:
        """What best_of ranks samples by (their log-probabilities must have been asked for)."""
        return self.cumulative_logprob / max(len(self.output_token_ids), 1)

    def append(self, token_id: int, logprobs=None, finish_reason: Optional[str] = None) -> None:
        """Take one token (the core says whether EOS or max_tokens ended the sequence there),
        its text, and end the sequence if that completes a stop string."""
        self.output_token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
            self.cumulative_logprob += logprobs.logprob
        self.finish_reason = finish_reason
        self.text += self.decoder.step(self.output_token_ids, is_last=finish_reason is not None)
        if self.truncate_at_stop_string():
            self.finish_reason = "stop"

    def truncate_at_stop_string(self) -> bool:
        # The text handed out holds no stop string, nor the start of one (it was held back).
        if not self.params.stop:
            return False
        found = [i for i in (self.text.find(s, self.num_text_sent) for s in self.params.stop) if i >= 0]
        if found:
            self.text = self.text[:min(found)]
        return bool(found)

    def output(self) -> SequenceOutput:
        """The text not yet handed out (less what is held back) and the tokens since the last."""
        end = len(self.text) if self.finish_reason else len(self.text) - self.held_back
        end = max(end, self.num_text_sent)
        text, self.num_text_sent = self.text[self.num_text_sent:end], end
        first, self.num_tokens_sent = self.num_tokens_sent, len(self.output_token_ids)
        return SequenceOutput(self.index, text, self.output_token_ids[first:], self.finish_reason,
                              self.output_logprobs[first:] if self.output_logprobs else None)


class OutputProcessor:
    def __init__(self):
        self.seqs = {}  # seq_id: SequenceState, of the sequences not finished here
        self.num_waiting = 0  # of them, those with no token back yet

    def add(self, seqs: list) -> None:
        self.seqs.update((s.seq_id, s) for s in seqs)
        self.num_waiting += len(seqs)

    def finish(self, seq: SequenceState) -> None:
        """Forget a sequence (it ended, or its client left): tokens for it are dropped."""
        seq.is_finished = True
        self.num_waiting -= seq.is_waiting
        seq.is_waiting = False
        self.seqs.pop(seq.seq_id, None)

    def take(self, steps: list) -> tuple:
        """Take the StepOutputs that arrived together, in order: (the sequences they added
        to, the ids of those a stop string ended, which the core must stop)."""
        touched, stopped = {}, []
        for outputs in steps:
            for seq_id, token_id in zip(outputs.seq_ids, outputs.token_ids):
                seq = self.seqs.get(seq_id)
                if seq is None:  # ended here (a stop string, a client gone) after it was launched
                    continue
                if seq.is_waiting:
                    seq.is_waiting = False
                    self.num_waiting -= 1
                seq.append(token_id, outputs.logprobs.get(seq_id), outputs.finished.get(seq_id))
                touched[seq_id] = seq
                if seq.finish_reason:
                    self.finish(seq)
                    if seq_id not in outputs.finished:
                        stopped.append(seq_id)
        return list(touched.values()), stopped

    @staticmethod
    def hand_out(seqs: list) -> None:
        """Each sequence's one output of all it added: a handler behind by several steps gets one."""
        for seq in seqs:
            seq.outbox.put_nowait(seq.output())

    def fail_all(self, error: Exception) -> None:
        for seq in list(self.seqs.values()):
            seq.outbox.put_nowait(error)
            self.finish(seq)
