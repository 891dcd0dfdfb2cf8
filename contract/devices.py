"""Device names as the command line takes them and as the contract passes them."""
import time
from functools import lru_cache
from pathlib import Path

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


def parse_cpus(text: str) -> set:
    """"0-3,8" -> {0, 1, 2, 3, 8}."""
    cpus = set()
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


@lru_cache(maxsize=None)
def core_siblings(cpu: int) -> frozenset:
    """`cpu` and the hardware threads that share its physical core (SMT), as Linux lists
    them: work on a sibling slows a host-bound engine timed on `cpu`."""
    try:
        listed = parse_cpus(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text())
    except (OSError, ValueError):
        listed = set()
    return frozenset(listed | {cpu})


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
    """The ramp's operand, made once (fitness.bench ramps before its cases)."""
    return torch.randn(4096, 4096, device=device, dtype=torch.float16)
