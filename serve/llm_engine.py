"""The serving loop: schedule a step, launch it, read back the one before, hand out its tokens.

The scheduler and every sequence are touched only on the event loop; the engine calls run
in a worker thread (one at a time), so the server keeps answering while the model
computes, and a request that arrives during a step joins at the next one. Each step is
launched before the one ahead of it is read back (serve.model_runner): a sequence that
meets EOS or a stop string in the step read back was launched once more, and that token
is dropped; max_tokens is known ahead, so no sequence decodes past it.
"""
import asyncio
import logging

from serve.model_runner import ModelRunner, Step
from serve.sampling import SamplingParams
from serve.scheduler import Scheduler
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

    def submit(self, prompts: list, params: SamplingParams, num_samples: int = 1) -> tuple:
        """Queue num_samples sequences per prompt; (their shared outbox, the sequences, a
        prompt's samples side by side).

        Each sample is its own engine request, its prompt prefilled again: the engine's
        contract (prefill, decode, remove) has no way to share one request's K/V with
        another. Raises QueueFull when the waiting queue cannot take them all.
        """
        if self.error is not None:
            raise RuntimeError(f"the engine failed: {self.error!r}")
        outbox = asyncio.Queue()
        seqs = [Sequence(prompt, params.for_sample(j), self.tokenizer, outbox, i * num_samples + j)
                for i, prompt in enumerate(prompts) for j in range(num_samples)]
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
            step = None  # launched, its tokens not yet read back
            while True:
                if step is None:
                    await self.wake_up.wait()
                    if not self.scheduler.has_work():
                        self.wake_up.clear()
                        continue
                # The next step is launched before this one's tokens are read: on a GPU it
                # computes while they become text and reach their clients.
                batch = self.scheduler.schedule(step.seqs if step else ())
                launched, tokens = await asyncio.to_thread(self.runner.advance,
                                                           None if batch.is_empty() else batch, step)
                took = self.take(step, tokens) if step else []
                step = launched
                self.hand_out(took)
        except Exception as error:  # the engine's state is unknown now: fail everyone
            log.exception("the serving loop stopped")
            self.error = error
            self.fail_all(error)

    def take(self, step: Step, tokens: list) -> list:
        """Append each sequence its token; those that end here (EOS, max_tokens) leave the
        running batch. The sequences that took one."""
        took = []
        logprobs = step.logprobs()
        for row, (seq, token) in enumerate(zip(step.seqs, tokens)):
            if seq.is_finished:  # ended (EOS, stop string, a client gone) after it was launched
                continue
            self.num_generated_tokens += 1
            seq.append(token, logprobs.get(row))
            if seq.finish_reason:
                self.scheduler.finish(seq)
            took.append(seq)
        return took

    def hand_out(self, seqs: list) -> None:
        """Each sequence's new text to its request's handler."""
        for seq in seqs:
            output = seq.detokenize()
            if seq.finish_reason and not seq.is_finished:  # a stop string ended it
                self.scheduler.finish(seq)
            seq.outbox.put_nowait(output)

    def fail_all(self, error: Exception) -> None:
        for seq in list(self.scheduler.waiting) + self.scheduler.running:
            seq.outbox.put_nowait(error)
