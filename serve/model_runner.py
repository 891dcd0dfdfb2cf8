"""Executes scheduled steps through the engine's three calls, then samples.

The engine file is imported the way the judge imports it (`contract.loader`), and driven
only through the contract: prefill, decode and remove by request id.

A step is launched before the one ahead of it is read back: its decodes take their
input tokens from that step's sampled tokens on the device, so on a GPU the next step is
queued while the host still waits for the last one, and the GPU does not idle between
steps while the host hands tokens out (vLLM's async scheduling). Nothing here makes the
host wait for the device but `LaunchedStep.tokens`: host values go up through pinned memory.
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from contract.loader import load_engine_module
from serve.sampling import SampledLogprobs, SamplingParams, logprobs_of, make_generator, sample, to_device
from serve.scheduler import Batch
from serve.sequence import Sequence, TokenLogprobs

WARM_UP_PROMPT_LEN = 16
WARM_UP_LONG_PROMPT_LEN = 1024  # prompts of a full prefill step at warm-up


def load_engine(engine_path, model_config_path, weight_dir, device: str):
    model_config = json.loads(Path(model_config_path).read_text())
    module = load_engine_module(engine_path)
    return module.create_engine(model_config, str(weight_dir), device)


def warm_up_plan(max_num_seqs: int, max_num_prefill_tokens: int, max_model_len: int) -> list:
    """(prompts, their length, the batch sizes then decoded) of each warm-up prefill: 1, 2, 3
    and as many long prompts as a step admits, then decodes at every batch size down from
    max_num_seqs. An engine's Triton kernels compile anew for each new specialization of their
    arguments (a count of 1, a multiple of 16), and torch and CUDA load kernels and pin memory
    on first use: on an H200, a fresh server warmed by one short prefill and decode sent its
    first step 0.6-1.6 s after the first request came
    (docs/log/2026-11-29-server-warm-up-whole-step.md)."""
    length = max(1, min(WARM_UP_LONG_PROMPT_LEN, max_model_len // 2, max_num_prefill_tokens))
    most = max(1, min(max_num_seqs, max_num_prefill_tokens // length))
    short = max(1, min(WARM_UP_PROMPT_LEN, max_model_len - max_num_seqs - 1))
    return [(1, WARM_UP_PROMPT_LEN, [1]), (2, WARM_UP_PROMPT_LEN + 1, [2]), (3, length, [3]), (most, length, [most]),
            (max_num_seqs, short, list(range(max_num_seqs, 0, -1)))]


class ModelRunner:
    def __init__(self, engine, device: str):
        self.engine = engine
        self.device = torch.device(device)

    @torch.inference_mode()
    def warm_up(self, max_num_seqs: int, max_num_prefill_tokens: int, max_model_len: int) -> None:
        """The steps a server meets (warm_up_plan), before its first client does, each
        sampled (greedy, and seeded with log-probabilities) and read back, as requests are.
        On a CPU, where nothing compiles per shape, one short prefill and decode."""
        plan = warm_up_plan(max_num_seqs, max_num_prefill_tokens, max_model_len) if self.device.type == "cuda" \
            else [(2, WARM_UP_PROMPT_LEN, [2])]
        for count, prompt_len, decode_sizes in plan:
            self.warm_up_steps([[0] * prompt_len] * count, decode_sizes)

    def warm_up_steps(self, prompts: list, decode_sizes) -> None:
        """`prompts` prefilled in one step, then a decode step of the first n of them for each
        n of decode_sizes, each read back; then removed."""
        greedy, seeded = SamplingParams(temperature=0.0, max_tokens=2), \
            SamplingParams(top_k=8, top_p=0.9, seed=0, max_tokens=2, logprobs=2)
        seqs = [Sequence(prompt, seeded if i == len(prompts) - 1 else greedy) for i, prompt in enumerate(prompts)]
        step = None
        for batch in [Batch(prefill=seqs)] + [Batch(decode=seqs[:n]) for n in decode_sizes]:
            step = self.launch(batch, step)
            step.tokens()
            step.logprobs()
        self.engine.remove([s.seq_id for s in seqs])

    def launch(self, batch: Batch, previous: Optional["LaunchedStep"]) -> "LaunchedStep":
        if batch.remove:
            self.engine.remove(batch.remove)
        logits = []
        if batch.prefill:
            logits.append(self.prefill(batch.prefill))
        if batch.decode:
            logits.append(self.decode(batch.decode, previous))
        seqs = batch.prefill + batch.decode
        if not logits:
            return LaunchedStep(seqs, None)
        logits = logits[0] if len(logits) == 1 else torch.cat(logits)
        params = [s.params for s in seqs]
        tokens = sample(logits, params, [s.generator for s in seqs])
        return LaunchedStep(seqs, tokens, logprobs_of(logits, tokens, params))

    def prefill(self, seqs: list) -> torch.Tensor:
        for seq in seqs:
            seq.generator = make_generator(seq.params, self.device)
        prompts = [to_device(s.prompt_token_ids, torch.long, self.device) for s in seqs]
        return self.engine.prefill([s.seq_id for s in seqs], prompts)

    def decode(self, seqs: list, previous: Optional["LaunchedStep"]) -> torch.Tensor:
        """Each sequence's newest token is its input: from `previous`'s tokens on the
        device when that step is not read back yet (every running sequence was in it)."""
        if previous is None:
            tokens = to_device([s.last_token_id for s in seqs], torch.long, self.device)
        else:
            row = {seq: i for i, seq in enumerate(previous.seqs)}
            tokens = previous.device_tokens[to_device([row[s] for s in seqs], torch.long, self.device)]
        return self.engine.decode([s.seq_id for s in seqs], tokens)


def queued_copy_to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A pinned host tensor that `tensor` is copied into once the device gets to it."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


@dataclass(eq=False)
class LaunchedStep:
    """A launched step: its sequences, in the order of its tokens, and the tokens (and the
    log-probabilities asked for), still on the device; their copy to the host is queued at
    once."""
    seqs: list
    device_tokens: Optional[torch.Tensor]
    device_logprobs: Optional[SampledLogprobs] = None

    def __post_init__(self):
        self.ready = None
        self.host = [self.device_tokens] if self.device_tokens is not None else []
        if self.device_logprobs is not None:
            self.host += [self.device_logprobs.values, self.device_logprobs.token_ids]
        if self.host and self.host[0].is_cuda:
            device = self.host[0].device
            self.host = [queued_copy_to_host(t) for t in self.host]
            self.ready = torch.cuda.Event()  # on the tokens' device, which need not be the current one
            self.ready.record(torch.cuda.current_stream(device))

    def tokens(self) -> list:
        """The sampled tokens on the host: the step's one wait for the device."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host[0].tolist() if self.host else []

    def logprobs(self) -> dict:
        """{row: TokenLogprobs} of the rows that asked; call after tokens(), which waited."""
        if self.device_logprobs is None:
            return {}
        values, token_ids = (t.tolist() for t in self.host[1:])
        return {row: TokenLogprobs.of_row(v, ids, self.seqs[row].params.logprobs)
                for row, v, ids in zip(self.device_logprobs.rows, values, token_ids)}
