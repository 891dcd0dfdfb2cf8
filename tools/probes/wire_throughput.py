"""How long a run's outputs take from a runner to the judge (fitness.wire over a pipe).

    python -m tools.probes.wire_throughput [--outputs 64] [--device cuda] [--wire OLD_WIRE.py ...]

A child process makes `--outputs` logits of [64, 151936] bf16 (one 64 x 256 x 64 decode case
on the Qwen3-0.6B shape: 1.2 GB) and sends them as a runner answers `fetch`; this process
receives them. `--wire` times other versions of fitness/wire.py beside the current one, in
turn (`git show REV:fitness/wire.py > /tmp/wire_REV.py`).
"""
import argparse
import importlib.util
import os
import time

import torch

from fitness import wire as current_wire

ROWS, VOCAB = 64, 151936


def load_wire(path: str):
    spec = importlib.util.spec_from_file_location(f"wire_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fetch_seconds(wire, outputs: int, device: str) -> tuple[float, float]:
    """(seconds to receive, GB received) of one message of `outputs` logits."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the runner's side
        os.close(read_fd)
        logits = [torch.randn(ROWS, VOCAB, device=device).to(torch.bfloat16) for _ in range(outputs)]
        if device == "cuda":
            torch.cuda.synchronize()
        os.write(write_fd, b"R")
        wire.Channel(-1, write_fd).send({"ok": True}, logits)
        os._exit(0)
    os.close(write_fd)
    assert os.read(read_fd, 1) == b"R"
    start = time.perf_counter()
    _, tensors = wire.Channel(read_fd, -1).receive()
    seconds = time.perf_counter() - start
    os.waitpid(pid, 0)
    os.close(read_fd)
    return seconds, sum(t.numel() * t.element_size() for t in tensors) / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--wire", nargs="*", default=[], help="other fitness/wire.py files to time in turn")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    wires = [("current", current_wire)] + [(path, load_wire(path)) for path in args.wire]
    for _ in range(args.rounds):
        for name, wire in wires:
            seconds, gb = fetch_seconds(wire, args.outputs, args.device)
            print(f"{name}: {gb:.2f} GB in {seconds:.2f} s ({gb / seconds:.2f} GB/s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
