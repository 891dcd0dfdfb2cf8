"""Sampling for a whole batch at once, on the logits' device.

Every row's temperature, top-k and top-p are tensors, so one step samples the batch in
a handful of kernels, and the only host sync is the caller's, once per step, to read
the tokens. Sampling draws q ~ Exp(1) and takes argmax(p / q), which is a draw from p
(the Gumbel-max trick in exponential form, as vLLM does): a request with a seed draws
its row's noise from a generator of its own, so its tokens do not depend on its
neighbours in the batch.

Log-probabilities are computed beside sampling, for the rows that asked only, and copied
to the host with the tokens, so a request without them pays nothing.
"""
from dataclasses import dataclass, replace
from typing import Optional

import torch

SEED_LIMIT = 2**63  # seeds stay within int64
LOGPROB_FLOOR = -9999.0  # JSON has no -inf; vLLM answers this floor for it too


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: every token
    seed: Optional[int] = None
    max_tokens: int = 16
    stop: tuple = ()
    ignore_eos: bool = False
    logprobs: Optional[int] = None  # None: none; k: the sampled token's and the top k's

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def for_sample(self, index: int) -> "SamplingParams":
        """The params of a prompt's index-th sample: seeded samples draw from seed, seed + 1,
        ..., so they differ from each other yet repeat (vLLM seeds its n samples so)."""
        if self.seed is None or index == 0:
            return self
        return replace(self, seed=(self.seed + index) % SEED_LIMIT)


def to_device(values: list, dtype, device) -> torch.Tensor:
    """A tensor of host values on `device`, without waiting for the device: a plain copy
    from pageable memory would wait for every kernel queued before it."""
    tensor = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def make_generator(params: SamplingParams, device) -> Optional[torch.Generator]:
    """A request's own random stream when it asked for a seed; None otherwise."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def sample(logits: torch.Tensor, params: list, generators: list) -> torch.Tensor:
    """Next tokens [B] from logits [B, vocab], row i sampled with params[i]."""
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if all(p.is_greedy for p in params):
        return greedy
    device = logits.device
    # A greedy row divides by 1 (any value would do: its sample is replaced below).
    temperatures = to_device([p.temperature or 1.0 for p in params], torch.float32, device)
    logits = logits / temperatures[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = to_device([p.top_k for p in params], torch.long, device)
        top_p = to_device([p.top_p for p in params], torch.float32, device)
        logits = mask_top_k_top_p(logits, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    sampled = (probs / exponential_noise(probs, generators)).argmax(dim=-1)
    is_greedy = to_device([p.is_greedy for p in params], torch.bool, device)
    return torch.where(is_greedy, greedy, sampled)


def exponential_noise(probs: torch.Tensor, generators: list) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    return noise


def mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Logits [B, vocab] with every token outside each row's top-k and top-p set to -inf.

    top_k [B] (0: all), top_p [B] (1: all). One sort serves both filters.
    """
    vocab = logits.shape[-1]
    ascending, order = logits.sort(dim=-1)  # [B, vocab], the largest last
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    kth_largest = ascending.gather(-1, (vocab - k)[:, None])  # [B, 1]
    ascending = ascending.masked_fill(ascending < kth_largest, float("-inf"))
    # Drop the smallest tokens whose mass together stays within 1 - top_p.
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    outside = cumulative <= (1.0 - top_p)[:, None]
    outside[:, -1] = False  # the most likely token always stays
    ascending = ascending.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, ascending)


@dataclass
class SampledLogprobs:
    """The log-probabilities of a step's rows that asked for them, still on the device."""
    rows: list  # those rows' places in the batch
    values: torch.Tensor  # [R, 1 + K] fp32: the sampled token's, then the top K's
    token_ids: torch.Tensor  # [R, 1 + K]: the sampled token, then the top K, the likeliest first


def logprobs_of(logits: torch.Tensor, tokens: torch.Tensor, params: list) -> Optional[SampledLogprobs]:
    """Log-probabilities for the rows of logits [B, vocab] whose params ask (None if none
    does), K the most any of them asks.

    They are the model's own (fp32 log-softmax of the raw logits, before temperature,
    top-k and top-p), as vLLM reports them by default: a text's likelihood under
    the model, so best_of ranks samples alike whatever their temperature, and a greedy
    answer's log-probabilities are the reference's.
    """
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None
    num_top = max(params[i].logprobs for i in rows)
    if len(rows) < len(params):
        index = to_device(rows, torch.long, logits.device)
        logits, tokens = logits[index], tokens[index]  # [R, vocab], [R]
    logprobs = logits.float().log_softmax(dim=-1).clamp(min=LOGPROB_FLOOR)  # [R, vocab]
    token_ids = tokens[:, None]  # [R, 1]
    if num_top:  # best_of alone needs no top-k
        token_ids = torch.cat([token_ids, logprobs.topk(num_top, dim=-1).indices], dim=1)  # [R, 1 + K]
    return SampledLogprobs(rows, logprobs.gather(-1, token_ids), token_ids)
