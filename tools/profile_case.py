"""Where one case's time goes, per call: wall time, GPU busy time and kernel count.

    python -m tools.profile_case --engine E --model-config C --weight-dir W --case decode [--cases public] [--top 8]

A warm-up engine runs the case once; a fresh engine then runs it call by call, synchronised
around each call (wall time), and once more under torch.profiler (GPU time and kernels,
summed over the case, shown per call kind). `--passes N` runs the case N times on that
fresh engine and reports each pass: a first pass slower than the next pays for something
lazy (a graph's first launch, an allocation) inside the timed calls. A call whose wall time is far above its GPU
time is host-bound: launches, Python and copies, not the GPU, bound it. `--top N` adds the N
kernels that took the most GPU time over the case (name, count, total and mean microseconds).
A kernel launched under programmatic dependent launch counts its wait for the kernel before
as its own time (the split-KV combine reads as long as the partial it waits on), so these
rank kernels rather than time them: `python -m tools.probes.step_timeline` gives what each adds.
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from contract.loader import load_engine_module
from fitness.bench import CASE_SEED
from fitness.cases import CASE_SETS, select_cases
from fitness.traces import materialize, replay


def wall_times(engine, calls) -> list:
    """(kind, seconds) of each call, synchronised on both sides."""
    times = []
    with torch.no_grad():
        for call in calls:
            torch.cuda.synchronize()
            started = time.perf_counter()
            replay(engine, call)
            torch.cuda.synchronize()
            times.append((call.event.kind, time.perf_counter() - started))
    return times


def gpu_profile(engine, calls, top: int = 0) -> dict:
    """Kernel count and GPU microseconds over the whole case; the `top` costliest kernels."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.no_grad():
        for call in calls:
            replay(engine, call)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name = {}
    for e in kernels:
        count, total = by_name.get(e.name, (0, 0.0))
        by_name[e.name] = (count + 1, total + e.device_time_total)
    costliest = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    return {"kernels": len(kernels), "gpu_us": sum(total for _, total in by_name.values()),
            "top": [{"name": name[:80], "count": count, "total_us": round(total, 1), "mean_us": round(total / count, 2)}
                    for name, (count, total) in costliest]}


def per_kind(times) -> dict:
    """{kind: count, median and max milliseconds} of one pass's (kind, seconds)."""
    by_kind = {}
    for kind, seconds in times:
        by_kind.setdefault(kind, []).append(seconds * 1e3)
    return {kind: {"count": len(ms), "median_ms": round(statistics.median(ms), 3), "max_ms": round(max(ms), 3)}
            for kind, ms in by_kind.items()}


def case_arguments(description: str) -> argparse.ArgumentParser:
    """A parser for a tool that runs one engine's benchmark cases on a config."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--weight-dir", type=Path, required=True)
    parser.add_argument("--cases", choices=CASE_SETS, default="public")
    parser.add_argument("--case", action="append", help="case names (default: every case of the set)")
    return parser


def main(argv=None) -> int:
    parser = case_arguments(__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=0, help="list the N kernels with the most GPU time")
    parser.add_argument("--passes", type=int, default=1, help="run the case this many times on one fresh engine")
    args = parser.parse_args(argv)
    config = json.loads(args.model_config.read_text())
    module = load_engine_module(args.engine)
    cases = select_cases(args.cases)
    for name in args.case or cases:
        events = cases[name]
        warm = module.create_engine(dict(config), str(args.weight_dir), "cuda")
        wall_times(warm, materialize(events, config["vocab_size"], CASE_SEED, "cuda"))
        engine = module.create_engine(dict(config), str(args.weight_dir), "cuda")
        passes = [wall_times(engine, materialize(events, config["vocab_size"], CASE_SEED, "cuda"))
                  for _ in range(args.passes)]
        del engine
        gpu = gpu_profile(module.create_engine(dict(config), str(args.weight_dir), "cuda"),
                          materialize(events, config["vocab_size"], CASE_SEED, "cuda"), args.top)
        print(json.dumps({
            "engine": str(args.engine), "case": name, "wall_ms": round(sum(s for _, s in passes[0]) * 1e3, 3),
            "gpu_ms": round(gpu["gpu_us"] / 1e3, 3), "kernels": gpu["kernels"], "calls": per_kind(passes[0]),
            **({"later_passes": [{"wall_ms": round(sum(s for _, s in times) * 1e3, 3), "calls": per_kind(times)}
                                 for times in passes[1:]]} if args.passes > 1 else {}),
            **({"top": gpu["top"]} if args.top else {}),
        }), flush=True)
        del warm
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
