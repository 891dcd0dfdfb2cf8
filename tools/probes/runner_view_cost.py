"""What the runner's per-call tensor work costs the host on this machine: slicing the slot's
mapped inputs, and keeping a copy of an output (docs/log/2026-11-28-runner-call-cost.md).

    python -m tools.probes.runner_view_cost [--device cuda|cpu] [--calls 2000]

Each line: microseconds a call, median of 5 batches of `--calls`, host time only (the device
is synchronised after each batch, outside the clock).
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch

from fitness.bench import synchronize
from fitness.runner import OutputCopies, mapped_on_device
from fitness.wire import Slot


def per_call_us(fn, calls: int, device) -> float:
    times = []
    for _ in range(5):
        synchronize(device)
        started = time.perf_counter()
        for i in range(calls):
            fn(i)
        times.append((time.perf_counter() - started) / calls * 1e6)
        synchronize(device)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.runner_view_cost")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    device, n = torch.device(args.device), args.calls
    slot = Slot()
    host = torch.from_numpy(slot.inputs)
    mapped = mapped_on_device(host, device) if device.type == "cuda" else host
    plain = torch.zeros(len(slot.inputs), dtype=torch.long, device=device)
    out = torch.randn(8, 6000, device=device, dtype=torch.float16)
    dest = torch.empty_like(out)
    buffer = torch.zeros(1 << 24, dtype=torch.uint8, device=device)
    size = out.numel() * out.element_size()
    cases = {
        "slice a device tensor": lambda i: plain[i * 8:i * 8 + 8],
        "slice the mapped inputs": lambda i: mapped[i * 8:i * 8 + 8],
        "narrow the mapped inputs": lambda i: mapped.narrow(0, i * 8, 8),
        "slice the host inputs": lambda i: host[i * 8:i * 8 + 8],
        "buffer slice + 2 views": lambda i: buffer[:size].view(out.dtype).view(out.shape),
        "copy_ into a kept tensor": lambda i: dest.copy_(out),
        "clone": lambda i: out.clone(),
        "host slice .to(device)": lambda i: host[i * 8:i * 8 + 8].to(device, non_blocking=True),
    }
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    mapping = f"mapped: {mapped is not None}" if device.type == "cuda" else "the host's inputs as they are"
    print(f"{name}; {mapping}; torch {torch.__version__}")
    for name, fn in cases.items():
        print(f"{name:28s} {per_call_us(fn, n, device):7.2f} us a call", flush=True)
    print(f"{'OutputCopies.keep':28s} {keep_us(out, n, device):7.2f} us a call", flush=True)
    return 0


def keep_us(out, calls: int, device) -> float:
    """OutputCopies.keep as a run keeps its outputs: its buffer made by a first run as large,
    and readied before each (start, untimed, as the runner's prepare does)."""
    copies, times = OutputCopies(), []
    for _ in range(6):
        copies.start(device)
        synchronize(device)
        started = time.perf_counter()
        for _ in range(calls):
            copies.keep(out)
        times.append((time.perf_counter() - started) / calls * 1e6)
        synchronize(device)
    return statistics.median(times[1:])  # the first run grew the buffers


if __name__ == "__main__":
    sys.exit(main())
