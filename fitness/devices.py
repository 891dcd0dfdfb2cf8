"""Device names as the command line takes them and as the contract passes them."""
import time
from functools import lru_cache

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> str:
    """"auto" becomes "cuda" when a GPU is visible, else "cpu"; the evaluator never passes
    "auto" to an engine, so neither do we."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def ramp_gpu_clocks(device, seconds: float = 0.3) -> None:
    """Busy the GPU before timing anything. An idle H100/H200 sits at 345 MHz against
    ~1980 MHz under load (device/KINDS.md): the first case would be timed on a cold chip."""
    if not is_cuda(device):
        return
    a = ramp_matrix(str(device))
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a @ a
        torch.cuda.synchronize()


@lru_cache(maxsize=None)
def ramp_matrix(device: str) -> torch.Tensor:
    """The ramp's operand, made once: the judge bursts before every timed run."""
    return torch.randn(4096, 4096, device=device, dtype=torch.float16)
