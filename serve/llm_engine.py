"""The serving loop: schedule a step, run it off the event loop, hand each request its output.

The scheduler and every sequence are touched only on the event loop; a step's engine
calls run in a worker thread (one at a time), so the server keeps answering while the
model computes, and a request that arrives during a step joins at the next one.
"""
import asyncio
import logging

from serve.model_runner import ModelRunner
from serve.sampling import SamplingParams
from serve.scheduler import Batch, Scheduler
from serve.sequence import Sequence
from serve.tokenizer import Tokenizer

log = logging.getLogger("serve")


class LLMEngine:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, tokenizer: Tokenizer):
        self.runner = runner
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.wake_up = asyncio.Event()
        self.error = None  # what stopped the loop, if anything did
        self.num_generated_tokens = 0  # since start, cancelled sequences' included

    @property
    def is_running(self) -> bool:
        return self.error is None

    def metrics(self) -> dict:
        return {"num_seqs_running": len(self.scheduler.running),
                "num_seqs_waiting": len(self.scheduler.waiting),
                "generation_tokens_total": self.num_generated_tokens}

    def submit(self, prompts: list, params: SamplingParams) -> tuple:
        """Queue one sequence per prompt; (their shared outbox, the sequences).

        Raises QueueFull when the waiting queue cannot take them all.
        """
        if self.error is not None:
            raise RuntimeError(f"the engine failed: {self.error!r}")
        outbox = asyncio.Queue()
        seqs = [Sequence(prompt, params, self.tokenizer, outbox, index)
                for index, prompt in enumerate(prompts)]
        self.scheduler.add(seqs)
        self.wake_up.set()
        return outbox, seqs

    def abort(self, seqs: list) -> None:
        """Cancel sequences (their client left): their slots free up at the next step."""
        for seq in seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq)
        self.wake_up.set()

    async def run_forever(self) -> None:
        try:
            while True:
                await self.wake_up.wait()
                if not self.scheduler.has_work():
                    self.wake_up.clear()
                    continue
                batch = self.scheduler.schedule()
                tokens = await asyncio.to_thread(self.runner.run, batch)
                self.hand_out(batch, tokens)
        except Exception as error:  # the engine's state is unknown now: fail everyone
            log.exception("the serving loop stopped")
            self.error = error
            self.fail_all(error)

    def hand_out(self, batch: Batch, tokens: list) -> None:
        for seq, token in zip(batch.prefill + batch.decode, tokens):
            if seq.is_finished:  # cancelled while the step ran
                continue
            self.num_generated_tokens += 1
            output = seq.append(token)
            if seq.finish_reason:
                self.scheduler.finish(seq)
            seq.outbox.put_nowait(output)

    def fail_all(self, error: Exception) -> None:
        for seq in list(self.scheduler.waiting) + self.scheduler.running:
            seq.outbox.put_nowait(error)
