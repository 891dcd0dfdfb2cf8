"""Sampling for a whole batch at once, on the logits' device.

Every row's temperature, top-k and top-p are tensors, so one step samples the batch in
a handful of kernels, and the only host sync is the caller's, once per step, to read
the tokens. Sampling draws q ~ Exp(1) and takes argmax(p / q), which is a draw from p
(the Gumbel-max trick in exponential form, as vLLM does): a request with a seed draws
its row's noise from a generator of its own, so its tokens do not depend on its
neighbours in the batch.
"""
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: every token
    seed: Optional[int] = None
    max_tokens: int = 16
    stop: tuple = ()
    ignore_eos: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


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
