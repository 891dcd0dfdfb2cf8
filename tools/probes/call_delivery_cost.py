"""What delivering a trace call by call costs a program, in this process, per case.

    python -m tools.probes.call_delivery_cost --engine E [--rounds 9] [--cases public]

Every variant times one pass over a case on a fresh engine (a warm-up engine alive),
synchronised at both ends as the contract's benchmark does; the variants take turns,
round by round, and each prints its median and range in ms and its median ratio to
`bench` over the rounds:
  bench       the calls back to back, every input on the device beforehand
  copy_each   each call's tokens copied to the device (from pinned memory) just before it
  proof_each  after each call, the checksum of its output read back (the host waits for
              the device): what a judge pays to know an output exists before the next
              call's inputs do
  proof_lag   after each call, the checksum of the call before it read back (the device
              may run one call ahead of the host)
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from contract.devices import is_cuda, ramp_gpu_clocks
from contract.loader import load_engine_module
from fitness.cases import select_cases
from fitness.traces import Call, materialize, replay
from tools.arguments import target_arguments

VARIANTS = ("bench", "copy_each", "proof_each", "proof_lag")


def checksum(out):
    return out.detach().reshape(-1).view(torch.uint8).sum(dtype=torch.int64)


def on_host(call: Call) -> Call:
    """The call with its tokens in pinned host memory."""
    if call.tokens is None:
        return call
    move = lambda t: t.cpu().pin_memory()  # noqa: E731
    tokens = [move(t) for t in call.tokens] if isinstance(call.tokens, list) else move(call.tokens)
    return Call(call.event, call.request_ids, tokens)


def to_device(call: Call, device) -> Call:
    if call.tokens is None:
        return call
    move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
    tokens = [move(t) for t in call.tokens] if isinstance(call.tokens, list) else move(call.tokens)
    return Call(call.event, call.request_ids, tokens)


def one_pass(engine, calls, host_calls, device, variant) -> float:
    torch.cuda.synchronize() if is_cuda(device) else None
    started = time.perf_counter()
    pending = None
    for call, host_call in zip(calls, host_calls):
        out = replay(engine, to_device(host_call, device) if variant == "copy_each" else call)
        if out is None:
            continue
        out = out.detach().clone()
        if variant == "proof_each":
            int(checksum(out).item())
        elif variant == "proof_lag":
            total = checksum(out)
            if pending is not None:
                int(pending.item())
            pending = total
    if pending is not None:
        int(pending.item())
    torch.cuda.synchronize() if is_cuda(device) else None
    return time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.call_delivery_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    target_arguments(parser, device="cuda")
    parser.add_argument("--cases", default="public")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    raw_config = json.loads(args.model_config.read_text())
    module = load_engine_module(args.engine)
    ramp_gpu_clocks(args.device)
    with torch.no_grad():
        for name, events in select_cases(args.cases).items():
            calls = materialize(events, raw_config["vocab_size"], 0, args.device)
            host_calls = [on_host(c) for c in calls] if is_cuda(args.device) else calls
            warm = module.create_engine(dict(raw_config), str(args.weight_dir), args.device)
            one_pass(warm, calls, host_calls, args.device, "bench")
            seconds = {v: [] for v in VARIANTS}
            for r in range(args.rounds):
                for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
                    engine = module.create_engine(dict(raw_config), str(args.weight_dir), args.device)
                    ramp_gpu_clocks(args.device, 0.02)
                    seconds[variant].append(one_pass(engine, calls, host_calls, args.device, variant))
                    del engine
            del warm
            for variant, times in seconds.items():
                ms = [s * 1e3 for s in times]
                ratio = statistics.median(t / b for t, b in zip(times, seconds["bench"]))
                print(f"{args.engine.name} {name:8s} {variant:11s} median {statistics.median(ms):7.3f} ms "
                      f"(min {min(ms):.3f}, max {max(ms):.3f}) x{ratio:.3f} of bench over {len(ms)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
