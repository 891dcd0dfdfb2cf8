"""What each way of putting a call's inputs on the device costs the host and the device
(issue 58; docs/log/2026-11-30-delivery-ways-fifth-5-minute-run.md). Among the ways, stream
writes: the values carried in the commands the host enqueues (CUDA's stream memory operations,
cuStreamBatchMemOp), so that no kernel reads them over the bus. On an H200 they cost more than
a mapped read: ~0.7 us of device a value.

    python -m tools.probes.input_delivery [--calls 300] [--repeat 5] [--count 64 128] [--fresh]

prints, for each way of putting `count` int64 values on the device (a mapped view, a pinned
copy, stream writes, already there), as given or copied into an engine's own buffer, the host
and device microseconds a call: alone, and in a chain the device bounds (a ~40 us kernel, the
delivery, a lookup that reads the values), where the way's device cost is its chain figure
less on_device's. In a chain, a host figure near the device's says the host waited.
"""
import argparse
import ctypes
import statistics
import sys
import time

import numpy as np
import torch

SLEEP_CYCLES = 80_000  # ~40 us at an H200's 1.98 GHz

# CUstreamBatchMemOpType (cuda.h). The flag that drops each write's memory barrier is refused
# by the _v2 entry points (CUDA_ERROR_INVALID_VALUE on an H200, driver 580): flags stay 0.
WRITE_VALUE_64 = 5
# Most operations one cuStreamBatchMemOp takes (cuda.h: "must be less than 256").
MOST_OPS = 255

# CUstreamMemOpWriteValueParams inside the 48-byte CUstreamBatchMemOpParams union.
WRITE_PARAMS = np.dtype({"names": ["operation", "address", "value", "flags", "alias"],
                         "formats": ["<u4", "<u8", "<u8", "<u4", "<u8"],
                         "offsets": [0, 8, 16, 24, 32], "itemsize": 48})


def driver_batch_mem_op():
    """cuStreamBatchMemOp from the driver torch loaded (CUDA 12 names it _v2)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    for name in ("cuStreamBatchMemOp_v2", "cuStreamBatchMemOp"):
        fn = getattr(cuda, name, None)
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]
            return fn
    raise RuntimeError("libcuda has no cuStreamBatchMemOp")


class StreamWrites:
    """Writes int64 values into `target` (a contiguous int64 device tensor) in the current
    stream's order: one 64-bit write a value, at most MOST_OPS a batch."""

    def __init__(self, target: torch.Tensor):
        self.target, self.base = target, target.data_ptr()
        self.ops = np.zeros(MOST_OPS, dtype=WRITE_PARAMS)
        self.ops["operation"] = WRITE_VALUE_64
        self.offsets = np.arange(MOST_OPS, dtype=np.uint64) * 8
        self.batch = driver_batch_mem_op()
        self.ops_at = self.ops.ctypes.data

    def write(self, start: int, values: np.ndarray) -> torch.Tensor:
        """target[start:start + len(values)] = values, in stream order; that slice."""
        stream = torch.cuda.current_stream().cuda_stream
        for first in range(0, len(values), MOST_OPS):
            part = values[first:first + MOST_OPS]
            n = len(part)
            self.ops["address"][:n] = self.offsets[:n] + np.uint64(self.base + (start + first) * 8)
            self.ops["value"][:n] = part.view(np.uint64)
            err = self.batch(stream, n, self.ops_at, 0)
            if err:
                raise RuntimeError(f"cuStreamBatchMemOp failed: CUresult {err}")
        return self.target[start:start + len(values)]


def main(argv=None) -> int:
    from fitness.runner import mapped_on_device
    parser = argparse.ArgumentParser(prog="python -m tools.probes.input_delivery", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="a batch of calls (few enough not to fill the queue)")
    parser.add_argument("--repeat", type=int, default=5, help="batches a figure; the median is printed")
    parser.add_argument("--count", type=int, nargs="*", default=[64, 128])
    parser.add_argument("--fresh", action="store_true",
                        help="as the judge does: each call's values written by the host just before it, "
                             "each batch on pages not read before")
    args = parser.parse_args(argv)
    device = "cuda"
    size = 1 << 22  # 32 MB, the slot's input region
    host = torch.zeros(size, dtype=torch.int64)
    mapped = mapped_on_device(host, device)
    assert mapped is not None, "the host region could not be mapped"
    pinned = torch.zeros(size, dtype=torch.int64).pin_memory()
    target = torch.zeros(size, dtype=torch.int64, device=device)
    writes = StreamWrites(target)
    values = np.random.default_rng(0).integers(0, 2**62, size, dtype=np.int64)
    host.numpy()[:] = values
    pinned.numpy()[:] = values
    check = writes.write(100, values[100:700])
    assert torch.equal(check.cpu(), torch.from_numpy(values[100:700])), "stream writes wrote other values"
    table = torch.randn(1 << 16, 256, device=device)
    static = torch.zeros(4096, dtype=torch.int64, device=device)  # an engine's graph input
    ways = {
        "mapped": lambda s, n: mapped[s:s + n],
        "pinned_copy": lambda s, n: pinned[s:s + n].to(device, non_blocking=True),
        "stream_writes": lambda s, n: writes.write(s, values[s:s + n]),
        "on_device": lambda s, n: target[s:s + n],
    }

    fresh_at, host_values = 0, host.numpy()  # --fresh: where the next batch's pages begin

    def batch(deliver, count, chain, into_static) -> tuple[float, float]:
        nonlocal fresh_at
        torch.cuda.synchronize()
        base = fresh_at if args.fresh else 0
        if args.fresh:
            fresh_at = (base + args.calls * count) % (size - args.calls * count)
        start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started = time.perf_counter()
        start_event.record()
        for call in range(args.calls):
            if chain:
                torch.cuda._sleep(SLEEP_CYCLES)
            at = base + call * count
            if args.fresh:
                host_values[at:at + count] = values[at:at + count]
            got = deliver(at, count)
            if into_static:  # as a graph-replaying engine takes its tokens
                got = static[:count].copy_(got, non_blocking=True)
            if chain:  # a small kernel that reads them: an embedding lookup
                table.index_select(0, got & 0xFFFF)
        end_event.record()
        host_us = (time.perf_counter() - started) / args.calls * 1e6
        torch.cuda.synchronize()
        return host_us, start_event.elapsed_time(end_event) * 1e3 / args.calls

    for count in args.count:
        for chain in (False, True):
            for into_static in (False, True):
                for name, deliver in ways.items():
                    figures = [batch(deliver, count, chain, into_static) for _ in range(args.repeat + 1)][1:]
                    host_us = statistics.median(f[0] for f in figures)
                    device_us = statistics.median(f[1] for f in figures)
                    print(f"count {count:4d} {'chain' if chain else 'alone'} {'copied in' if into_static else 'as given '} "
                          f"{name:14s} host {host_us:6.2f} us a call, device {device_us:6.2f} us a call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
