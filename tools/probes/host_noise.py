"""How steady this host is over a minute, for docs/log/2026-11-23-cv-of-a-judgement.md: what
bounds the spread of a host-bound engine's speed between judgements.

    python -m tools.probes.host_noise [--seconds 60] [--engine seed_engine/engine.py] [--cpu N]

In one process pinned to one core (the judge's timing core, the last, by default), in
turn: a pure-Python loop of a few ms, and one public decode trace on a fresh engine, each
right after 50 ms asleep ("idle") or 50 ms of spinning ("spun"). Per kind: median, CV,
range, and the drift: the correlation of each sample with the next of its kind, and the
CV of the medians of 10-second windows (the noise a judgement's own rounds cannot
average away).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from contract.devices import ramp_gpu_clocks, resolve_device
from contract.loader import load_engine_module
from fitness.cases import public_cases
from fitness.traces import materialize, replay
from tools.arguments import target_arguments

WINDOW_S = 10.0


def python_loop() -> None:
    total = 0
    for i in range(200_000):
        total += i * i % 7


def spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def fresh_engine(module, raw_config: dict, weight_dir, device: str, events, seed: int) -> tuple:
    with torch.no_grad():
        engine = module.create_engine(dict(raw_config), str(weight_dir), device)
        calls = materialize(events, raw_config["vocab_size"], seed, device)
        if device != "cpu":
            torch.cuda.synchronize()
        return engine, calls


def summary(samples: list) -> dict:
    """Median, CV, range, lag-1 correlation and the CV of 10 s window medians of (at, seconds)."""
    values = [s for _, s in samples]
    mean = statistics.fmean(values)
    pairs = list(zip(values, values[1:]))
    lag1 = statistics.correlation(*zip(*pairs)) if len(pairs) > 2 else None
    start = samples[0][0]
    windows = {}
    for at, s in samples:
        windows.setdefault(int((at - start) // WINDOW_S), []).append(s)
    medians = [statistics.median(w) for w in windows.values()]
    return {"n": len(values), "median_ms": round(statistics.median(values) * 1e3, 2),
            "cv": round(statistics.stdev(values) / mean, 3), "min_ms": round(min(values) * 1e3, 2),
            "max_ms": round(max(values) * 1e3, 2), "lag1_corr": lag1 and round(lag1, 2),
            "window_median_cv": round(statistics.stdev(medians) / statistics.fmean(medians), 3)
            if len(medians) > 1 else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.host_noise", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=Path("seed_engine/engine.py"))
    target_arguments(parser, device="auto")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--cpu", type=int, default=None, help="the core to pin to (default: the last)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    cpu = args.cpu if args.cpu is not None else sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    raw_config = json.loads(args.model_config.read_text())
    module = load_engine_module(args.engine)
    events = public_cases()["decode"]
    samples = {}
    ramp_gpu_clocks(device)
    started, i = time.monotonic(), 0
    while time.monotonic() - started < args.seconds:
        for before in (("idle", "spun") if i % 2 == 0 else ("spun", "idle")):
            for kind in ("python", "decode"):
                engine, calls = fresh_engine(module, raw_config, args.weight_dir, device, events, i) \
                    if kind == "decode" else (None, None)
                ramp_gpu_clocks(device, 0.02)
                time.sleep(0.05) if before == "idle" else spin(0.05)
                began = time.perf_counter()
                if kind == "python":
                    python_loop()
                else:
                    with torch.no_grad():
                        for call in calls:
                            replay(engine, call)
                    if device != "cpu":
                        torch.cuda.synchronize()
                samples.setdefault(f"{kind} after {before}", []).append((time.monotonic(), time.perf_counter() - began))
                engine = calls = None
        i += 1
    report = {kind: summary(values) for kind, values in samples.items()}
    for kind, stats in report.items():
        print(f"{kind:18s} {json.dumps(stats)}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "summary": report, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
