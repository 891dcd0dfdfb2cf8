"""Who runs next: continuous batching over a waiting queue and a running batch.

Each step, waiting sequences join (are prefilled) while the running batch has room, and
every running sequence decodes. Admission reserves a sequence's whole K/V need
(prompt + max_tokens) up front, so a running sequence never runs out of room and
nothing is ever preempted. The waiting queue is bounded: past it, new requests are
refused at once (the app answers 503) rather than left to wait without end.
"""
from collections import deque
from dataclasses import dataclass, field

from serve.sequence import Sequence, Status


class QueueFull(Exception):
    """The waiting queue cannot take a request now."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences decoding together
    max_num_kv_tokens: int = 64 * 2048  # K/V rows the engine can hold at once
    max_num_prefill_tokens: int = 16384  # prompt tokens prefilled in one step
    max_num_waiting: int = 1024  # requests waiting past which new ones are refused

    def __post_init__(self):
        for name, value in self.__dict__.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def fits_ever(self, num_kv_tokens: int) -> bool:
        """Whether a sequence needing this many K/V rows could ever be admitted."""
        return num_kv_tokens <= self.max_num_kv_tokens


@dataclass
class Batch:
    """One step's work: drop finished state, prefill the joining, decode the running."""
    remove: list = field(default_factory=list)  # engine request ids
    prefill: list = field(default_factory=list)  # Sequences
    decode: list = field(default_factory=list)  # Sequences

    def is_empty(self) -> bool:
        return not (self.remove or self.prefill or self.decode)


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.waiting = deque()
        self.running = []
        self.num_reserved_kv_tokens = 0
        self.to_remove = []  # ids whose engine state goes at the next step

    def add(self, seqs: list) -> None:
        """Queue a request's sequences together, or refuse them all."""
        if len(self.waiting) + len(seqs) > self.config.max_num_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting "
                            f"(limit {self.config.max_num_waiting})")
        self.waiting.extend(seqs)

    def schedule(self, in_flight: tuple = ()) -> Batch:
        """The next step. `in_flight`: the sequences of a step launched but not yet read
        back; those whose token there is their last (max_tokens) do not decode again."""
        ending = {seq for seq in in_flight if len(seq.output_token_ids) + 1 >= seq.params.max_tokens}
        batch = Batch(remove=self.to_remove, decode=[seq for seq in self.running if seq not in ending])
        self.to_remove = []
        num_prefill_tokens = 0
        while self.waiting and self.can_admit(self.waiting[0], num_prefill_tokens):
            seq = self.waiting.popleft()
            num_prefill_tokens += len(seq.prompt_token_ids)
            self.num_reserved_kv_tokens += seq.max_num_tokens
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.prefill.append(seq)
        return batch

    def can_admit(self, seq: Sequence, num_prefill_tokens: int) -> bool:
        """Whether `seq` joins this step, after prompts of num_prefill_tokens already did."""
        c = self.config
        has_slot = len(self.running) < c.max_num_seqs
        has_kv = self.num_reserved_kv_tokens + seq.max_num_tokens <= c.max_num_kv_tokens
        # A step's first prompt always goes, however long, so none waits forever.
        fits_step = (num_prefill_tokens == 0
                     or num_prefill_tokens + len(seq.prompt_token_ids) <= c.max_num_prefill_tokens)
        return has_slot and has_kv and fits_step

    def finish(self, seq: Sequence) -> None:
        """End a sequence (done or cancelled): its slot and K/V are free from the next step."""
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
        elif seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.num_reserved_kv_tokens -= seq.max_num_tokens
            self.to_remove.append(seq.seq_id)
        seq.status = Status.FINISHED

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.to_remove)
