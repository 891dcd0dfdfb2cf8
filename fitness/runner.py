"""The untrusted side of a judgement: one process that imports one candidate file and
drives its engine through the calls the judge sends, one at a time, handing back every
output.

    python -m fitness.runner READ_FD WRITE_FD SLOT_FD     (started by fitness.candidate)

It decides nothing. It holds no reference logits, no clock that counts and no
comparison: the judge (another process) times each run from its side, and compares the
outputs it fetches afterwards. Nor does it hold any input before it is due: the judge
draws every token and sends each call only once the call before it has returned, so no
frame, object or pipe buffer of this process holds a later call for an engine to read
ahead (tests/cheats.py). Every run goes through the same requests, so the candidate
cannot tell a checked run from a timed one:

    prepare  make a fresh engine (untimed); it knows nothing of the run to come. Then
             the run: its calls taken from the shared slot (fitness.wire.Slot), one at a
             time, each call's inputs arriving when it is due; each run, a copy of its
             output kept, answered; at `end`, the checksum of the run's outputs
    fetch    send the outputs (the judge checks them against the checksum) and the
             peak memory since prepare

`memory` reports the bytes the engine retains, `drop` lets the engines go, `exit` ends it.
"""
import gc
import os
import sys

import torch

from fitness.devices import is_cuda
from fitness.loader import load_engine_module
from fitness.traces import call_from_message, replay
from fitness.verdict import error_text
from fitness.wire import INPUT_DTYPES, NAP_S, Channel, Slot, encode, parse


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


class InputArena:
    """Where a run's inputs land on a GPU: each call's in a region of its own, copied from
    pinned memory without waiting for the device (a copy from pageable memory waits for
    every call queued before it: seen on an H100, the recipe's decode 35% slower). A run
    gets fresh device memory (made in `prepare`, untimed): an engine may keep its inputs."""

    TOKENS = 1 << 16  # a run's inputs, unless one needs more (then another region is made)

    def __init__(self, device):
        self.device, self.pinned, self.staging, self.memory, self.used = device, None, None, None, 0

    def reset(self) -> None:
        """A new run (the device is idle: the last run's copies are done)."""
        self.memory, self.used = torch.empty(self.TOKENS, dtype=torch.long, device=self.device), 0
        if self.pinned is None:
            self.pin(self.TOKENS)

    def pin(self, size: int) -> None:
        self.pinned = torch.empty(size, dtype=torch.long).pin_memory()
        self.staging = self.pinned.numpy()

    def place(self, values: torch.Tensor) -> torch.Tensor:
        n = values.numel()
        if self.used + n > self.memory.numel():  # rare: more than TOKENS in one run
            self.memory = torch.empty(max(n, self.TOKENS), dtype=torch.long, device=self.device)
            self.pin(self.memory.numel())
            self.used = 0
        self.staging[self.used:self.used + n] = values.numpy()  # no torch op: ~10 us less a call
        out = self.memory[self.used:self.used + n]
        out.copy_(self.pinned[self.used:self.used + n], non_blocking=True)
        self.used += n
        return out


class Runner:
    def __init__(self, slot=None):
        self.slot = slot
        self.module = self.engine = self.first = None
        self.device, self.outputs, self.inputs = "cpu", [], None

    def load(self, path: str, threads: int | None = None) -> dict:
        if threads:
            torch.set_num_threads(threads)
        self.module = load_engine_module(path)
        return {}

    def prepare(self, config: dict, weight_dir: str, device: str, new_engine: bool = True) -> dict:
        """A fresh engine, unless told to keep the last. The runner's first engine stays
        alive beside every later one (the contract's warm-up engine lives through the timed
        runs), whatever the run: how many engines live tells no timed run from a checked one."""
        self.outputs = []
        if new_engine or self.engine is None:
            if self.first is None:
                self.first = self.engine
            self.engine = None  # as the evaluator does: the old engine is dropped first
            with torch.no_grad():
                self.engine = self.module.create_engine(dict(config), weight_dir, device)
            self.device = device
        self.ready(device)
        return {}

    def ready(self, device) -> None:
        """Before a run: the device idle, fresh memory for its inputs, the collector done."""
        settle(device)
        if is_cuda(device):
            if self.inputs is None or self.inputs.device != device:
                self.inputs = InputArena(device)
            self.inputs.reset()
        gc.collect()  # every run starts with the collector in the same state

    def call(self, inputs=None, **fields) -> None:
        """One call, its inputs just delivered (`inputs`: request ids and tokens in one int64
        tensor, moved to the device with one copy); a copy of its output is kept."""
        call = call_from_message(fields, inputs, self.inputs.place if is_cuda(self.device) else lambda t: t)
        index = len(self.outputs)
        try:
            with torch.no_grad():
                out = replay(self.engine, call)
        except Exception as err:
            raise RuntimeError(f"call {index} ({call.event.kind}) raised {type(err).__name__}: {err}") from err
        # A copy: an engine may hand back a buffer its next call overwrites.
        self.outputs.append(out.detach().clone() if torch.is_tensor(out) else out)

    def run(self, busy_s: float) -> None:
        """The calls of the run that follows each `prepare`, taken from the slot as the
        judge sends them (waiting busy for `busy_s`, then napping), each answered there;
        the run ends at `end` (the answer: the outputs' checksum) or at the first call that
        fails (the answer: its error)."""
        while True:
            try:
                header, tensors = parse(self.slot.calls.take(nap_s=NAP_S, busy_s=busy_s), INPUT_DTYPES)
                if header.pop("op", "") == "end":
                    self.slot.answers.put(encode({"ok": True, "checksum": output_checksum(self.outputs)}))
                    return
                self.call(*tensors, **header)
            except Exception as err:  # the candidate's failure (or a message we cannot read)
                self.slot.answers.put(encode({"ok": False, "error": error_text(err)}))
                return
            self.slot.answers.put(DONE)

    def fetch(self) -> tuple[dict, list]:
        peak = torch.cuda.max_memory_allocated() if is_cuda(self.device) else 0
        return {"peak_bytes": peak}, self.outputs

    def memory(self) -> dict:
        return {"retained_bytes": retained_bytes(self.engine) if self.engine is not None else 0}

    def drop(self) -> dict:
        self.engine = self.first = None
        self.outputs = []
        return {}


# On a GPU a runner waits busy for this long after each answer (fitness.wire.spin_until_readable),
# so the core it is timed on is awake when `go` comes; the same after every answer, so
# nothing about the wait tells a timed call from a checked one.
SPIN_AFTER_ANSWER_S = 0.5


def serve(channel: Channel, slot, spin_s: float = 0.0) -> None:
    runner = Runner(slot)
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
        if op == "prepare":  # a run follows: the runner waits for its calls on the slot, not asleep in a pipe
            runner.run(spin_s)


REQUESTS = ("load", "prepare", "fetch", "memory", "drop")
DONE = encode({"ok": True})  # a call's answer, made once


def main(argv) -> int:
    read_fd, write_fd, slot_fd = (int(a) for a in argv)
    on_gpu = os.environ.get("JUDGE_DEVICE", "").startswith("cuda")
    if on_gpu:
        torch.zeros(1, device="cuda")  # the CUDA context now, while the judge does other work
    channel = Channel(read_fd, write_fd)
    channel.send({"ok": True, "ready": True})  # started: the judge may time others now
    serve(channel, Slot(slot_fd), SPIN_AFTER_ANSWER_S if on_gpu else 0.0)  # a CPU's cores are all at work
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
