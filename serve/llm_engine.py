"""The API process's side of the engine (vLLM V1's AsyncLLM): submit sequences, abort
them, and hand each step's tokens, as text, to the requests' handlers.

The scheduler, the model runner and sampling run in the engine core's process
(serve.engine_core), which sends one message a step; this side reads them on the event
loop, beside the HTTP handlers, while the core computes the next step. Admission's
waiting limit is counted here, where requests arrive: a sequence waits until its first
token is back (the core's own queue is never longer, since it hears of every abort first).
"""
import asyncio
import logging
import time
from typing import Optional

from serve.core_client import EngineCoreClient, EngineCoreDead
from serve.collector import GcPauses
from serve.output_processor import OutputProcessor, SequenceState
from serve.sampling import SamplingParams
from serve.scheduler import QueueFull, SchedulerConfig
from serve.tokenizer import Tokenizer

log = logging.getLogger("serve")


class LLMEngine:
    def __init__(self, client: EngineCoreClient, scheduler_config: SchedulerConfig, tokenizer: Tokenizer,
                 record_timeline: bool = False):
        self.client = client
        self.scheduler_config = scheduler_config
        self.tokenizer = tokenizer
        self.processor = OutputProcessor()
        self.error: Optional[Exception] = None  # what stopped the core, if anything did
        self.stats = {"num_seqs_running": 0, "num_seqs_waiting": 0, "generation_tokens_total": 0}
        self.latest = {}  # replica -> its latest StepOutputs (serve.replicas; one replica: 0)
        # With --timeline, a row a step: the core's times, then received, detokenized, handed,
        # its sequences and those still waiting, the collector's pauses in the core and here;
        # and when each request was submitted here and reached the core.
        self.timeline = [] if record_timeline else None
        self.submitted = [] if record_timeline else None
        self.arrived = [] if record_timeline else None
        self.gc_pauses = GcPauses() if record_timeline else None

    @property
    def is_running(self) -> bool:
        return self.error is None

    def metrics(self) -> dict:
        """The core's counts as of its latest step."""
        return dict(self.stats)

    def submit(self, prompts: list, params: SamplingParams, num_samples: int = 1) -> tuple:
        """Queue num_samples sequences per prompt; (their shared outbox, the sequences, a
        prompt's samples side by side).

        Each sample is its own engine request, its prompt prefilled again: the engine's
        contract (prefill, decode, remove) has no way to share one request's K/V with
        another. Raises QueueFull when the waiting queue cannot take them all.
        """
        if self.error is not None:
            raise RuntimeError(f"the engine failed: {self.error}")
        limit = self.scheduler_config.max_num_waiting
        num_seqs = len(prompts) * num_samples
        if self.processor.num_waiting + num_seqs > limit:
            raise QueueFull(f"{self.processor.num_waiting} requests are already waiting (limit {limit})")
        outbox = asyncio.Queue()
        seqs = [SequenceState(prompt, params.for_sample(j), self.tokenizer, outbox, i * num_samples + j)
                for i, prompt in enumerate(prompts) for j in range(num_samples)]
        self.processor.add(seqs)
        if self.submitted is not None:
            self.submitted.append(time.perf_counter())
        self.client.add([(s.seq_id, s.prompt_token_ids, s.params) for s in seqs])
        return outbox, seqs

    def abort(self, seqs: list) -> None:
        """Cancel sequences (their client left): their slots free up at the core's next step."""
        running = [s for s in seqs if not s.is_finished]
        for seq in running:
            self.processor.finish(seq)
        if running and self.error is None:
            self.client.abort([s.seq_id for s in running])

    async def run_forever(self) -> None:
        """Take the core's steps as they come, until it stops."""
        try:
            async for steps in self.client.steps():
                self.take(steps)
        except EngineCoreDead as error:  # the core's state is unknown now: fail everyone
            log.error("the engine core stopped: %s", error)
            self.error = error
            self.processor.fail_all(error)

    def take(self, steps: list) -> None:
        """StepOutputs that arrived together: their text to the handlers, stop strings to the core."""
        received = time.perf_counter()
        touched, stopped = self.processor.take(steps)
        if stopped:
            self.client.abort(stopped)
        detokenized = time.perf_counter()
        self.processor.hand_out(touched)
        for step in steps:
            self.latest[getattr(step, "replica", 0)] = step
        latest = self.latest.values()
        self.stats = {"num_seqs_running": sum(s.num_running for s in latest),
                      "num_seqs_waiting": sum(s.num_waiting for s in latest),
                      "generation_tokens_total": sum(s.num_generated_tokens for s in latest)}
        if self.timeline is not None:
            handed = time.perf_counter()
            api_gc_seconds = self.gc_pauses.take()
            for i, s in enumerate(steps):
                self.timeline.append([*s.times, received, detokenized, handed, len(s.seq_ids), s.num_waiting,
                                      s.gc_seconds, api_gc_seconds if i == 0 else 0.0])
                self.arrived += s.arrived

    def shutdown(self) -> None:
        if self.gc_pauses is not None:
            self.gc_pauses.stop()
        self.client.shutdown()
