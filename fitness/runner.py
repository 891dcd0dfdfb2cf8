"""The untrusted side of a judgement: one process that imports one candidate file and
drives its engine through traces the judge sends, handing back every output.

    python -m fitness.runner READ_FD WRITE_FD     (started by fitness.candidate)

It decides nothing. It holds no reference logits, no clock that counts and no
comparison: the judge (another process) times each `go` from its side, and compares
the outputs it fetches afterwards. Gate traces and timed runs go through the same three
requests, so the candidate cannot tell a checked call from a timed one:

    prepare  draw the trace's tokens from the judge's seed, make a fresh engine (untimed)
    go       run every call, keep a copy of each output, synchronise, answer a checksum
    fetch    send the outputs (the judge checks them against the go's checksum) and
             the peak memory since prepare

`memory` reports the bytes the engine retains, `drop` lets the engines go, `exit` ends it.
"""
import gc
import os
import sys

import torch

from fitness.devices import is_cuda
from fitness.loader import load_engine_module
from fitness.traces import Event, materialize, replay
from fitness.verdict import error_text
from fitness.wire import Channel


def retained_bytes(root, max_depth: int = 8) -> int:
    """Bytes of every distinct tensor storage reachable from an engine's attributes."""
    seen, storages = set(), {}
    stack = [(root, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > max_depth:
            continue
        seen.add(id(obj))
        if torch.is_tensor(obj):
            storage = obj.untyped_storage()
            storages[(obj.device, storage.data_ptr())] = storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
            stack.extend((v, depth + 1) for v in vars(obj).values())
    return sum(storages.values())


def output_checksum(outputs) -> int:
    """Sum of the bytes of every tensor output. The judge recomputes it from what `fetch`
    sends: an answer to `go` that came before the outputs existed cannot match it."""
    total = 0
    by_device = {}
    for out in outputs:
        if torch.is_tensor(out) and out.numel():
            by_device.setdefault(out.device, []).append(out.detach().contiguous().reshape(-1).view(torch.uint8))
    for parts in by_device.values():
        total += int(torch.cat(parts).sum(dtype=torch.int64).item())  # the .item() waits for the GPU
    return total


def settle(device) -> None:
    """After an engine is made: the device idle, its peak memory counted afresh, and the
    first read-back done. That read-back cost 1.3-1.5 ms on an H100 (later ones 0.02 ms),
    paid otherwise by the checksum inside the timed `go`, where it halved the judge's
    prefill figure against the benchmark's (docs/PERF.md, 2026-11-25)."""
    if is_cuda(device):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch.zeros((), device=device).item()


class Runner:
    def __init__(self):
        self.module = self.engine = self.warm = None
        self.spec, self.calls, self.outputs = None, [], []

    def load(self, path: str, threads: int | None = None) -> dict:
        if threads:
            torch.set_num_threads(threads)
        self.module = load_engine_module(path)
        return {}

    def prepare(self, config: dict, weight_dir: str, device: str, events: list, seed: int,
                keep_warm: bool = False, new_engine: bool = True) -> dict:
        """Draw the trace's inputs and, unless told to keep it, make a fresh engine. With
        `keep_warm`, the engine so far stays alive beside the new one, if none is kept yet
        (the contract's warm-up engine lives through the timed runs)."""
        self.calls = materialize([Event(**e) for e in events], config["vocab_size"], seed, device)
        self.outputs = []
        if new_engine or self.engine is None:
            if keep_warm and self.warm is None:  # a runner kept for the next judgement has one
                self.warm = self.engine
            self.engine = None  # as the evaluator does: the old engine is dropped first
            with torch.no_grad():
                self.engine = self.module.create_engine(dict(config), weight_dir, device)
            self.device = device
        settle(device)
        gc.collect()  # every run starts with the collector in the same state
        return {}

    def go(self) -> dict:
        """Every call of the prepared trace, back to back; the checksum of the outputs."""
        outputs = []
        with torch.no_grad():
            for index, call in enumerate(self.calls):
                try:
                    out = replay(self.engine, call)
                except Exception as err:
                    raise RuntimeError(f"call {index} ({call.event.name or call.event.kind}) raised "
                                       f"{type(err).__name__}: {err}") from err
                # A copy: an engine may hand back a buffer its next call overwrites.
                outputs.append(out.detach().clone() if torch.is_tensor(out) else out)
        self.outputs = outputs
        return {"checksum": output_checksum(outputs)}

    def fetch(self) -> tuple[dict, list]:
        kinds = [call.event.kind for call in self.calls]
        peak = torch.cuda.max_memory_allocated() if is_cuda(getattr(self, "device", "cpu")) else 0
        return {"kinds": kinds, "peak_bytes": peak}, self.outputs

    def memory(self) -> dict:
        return {"retained_bytes": retained_bytes(self.engine) if self.engine is not None else 0}

    def drop(self) -> dict:
        self.engine = self.warm = None
        self.outputs = []
        return {}


# On a GPU a runner waits busy for this long after each answer (fitness.wire.spin_until_readable),
# so the core it is timed on is awake when `go` comes; the same after every answer, so
# nothing about the wait tells a timed call from a checked one.
SPIN_AFTER_ANSWER_S = 0.5


def serve(channel: Channel, spin_s: float = 0.0) -> None:
    runner = Runner()
    while True:
        request, _ = channel.receive(spin_s=spin_s)
        op = request.pop("op", "")
        if op == "exit":
            return
        try:
            answer = getattr(runner, op)(**request) if op in REQUESTS else None
            if answer is None:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as err:  # the candidate's failure is the judge's evidence
            channel.send({"ok": False, "error": error_text(err)})
            continue
        header, tensors = answer if isinstance(answer, tuple) else (answer, [])
        channel.send({"ok": True, **header}, tensors)


REQUESTS = ("load", "prepare", "go", "fetch", "memory", "drop")


def main(argv) -> int:
    read_fd, write_fd = (int(a) for a in argv)
    on_gpu = os.environ.get("JUDGE_DEVICE", "").startswith("cuda")
    if on_gpu:
        torch.zeros(1, device="cuda")  # the CUDA context now, while the judge does other work
    channel = Channel(read_fd, write_fd)
    channel.send({"ok": True, "ready": True})  # started: the judge may time others now
    serve(channel, SPIN_AFTER_ANSWER_S if on_gpu else 0.0)  # a CPU's cores are all at work
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
