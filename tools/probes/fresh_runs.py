"""Each fresh engine's run of a case apart, under the contract's protocol: its ms, the CUDA
segments (cudaMalloc calls) it added and the SM clock just before it, where `fitness bench`
reports the median alone.

    python -m tools.probes.fresh_runs --engine E --model-config C --weight-dir W [--cases long]
        [--case NAME ...] [--repeat 5] [--keep-caches]

One JSON line per case. Written when the long_prompts cases' medians moved up to 1.6x
between fresh processes of one program (docs/log/2026-11-27-long-prompts-run-by-run.md): it
shows whether the runs spread or fall on levels, whether a run allocates device memory
inside its timed region, and whether a slow run started on a GPU whose clocks had dropped
while the engine was built (an idle H100 sits at 345 MHz; the benchmark bursts once a case
set; the judge, which burst before each run until 2026-12-01, no longer does).

`--keep-caches` tests one explanation of the new segments: `torch.cuda.graph` empties the
allocator's device and pinned-host caches before every capture, so an engine that captures
through it hands its predecessor's freed blocks back to the driver. With the emptying made a
no-op in this process, a run that still allocates (or still falls on two levels) is explained
otherwise. The graph alleles no longer empty them (`shared.captured`, since the thirty-eighth
session's H100 runs confirmed it), so the flag now changes what `torch.cuda.graph` itself
captures (torch.compile's graphs, a program of another source).
"""
import argparse
import json

import torch

from contract.devices import is_cuda, ramp_gpu_clocks
from contract.loader import load_engine_module
from fitness.bench import CASE_SEED, fresh_engine_runs, timed_run
from fitness.cases import CASE_SETS, select_cases
from fitness.traces import materialize


def segments() -> int:
    """cudaMalloc calls the caching allocator has made in this process so far."""
    return torch.cuda.memory_stats().get("segment.all.allocated", 0)


def sm_clock(device: str):
    """The SM clock in MHz as NVML last sampled it; None off CUDA or without pynvml."""
    if not is_cuda(device):
        return None
    try:
        return torch.cuda.clock_rate()
    except Exception:  # pynvml missing or NVML unreadable: the figure is optional
        return None


def keep_allocator_caches() -> None:
    """What `torch.cuda.graph.__enter__` calls before a capture, made to do nothing here."""
    torch.cuda.empty_cache = lambda: None
    torch._C._host_emptyCache = lambda: None


def case_runs(module, config: dict, weight_dir: str, device: str, events, repeat: int) -> dict:
    """{"ms": [each fresh run], "new_segments": [each run's], "sm_mhz": [the clock before each],
    "peak_mb": the contract's peak}."""
    added, clocks = [], []

    def timed(engine, calls, device):
        clocks.append(sm_clock(device))
        before = segments() if is_cuda(device) else 0
        seconds = timed_run(engine, calls, device)
        added.append(segments() - before if is_cuda(device) else 0)
        return seconds

    calls = materialize(events, config["vocab_size"], CASE_SEED, device)
    times, peak_bytes, _ = fresh_engine_runs(module, config, weight_dir, device, calls, 1, repeat, timed=timed)
    return {"ms": [round(t * 1e3, 2) for t in times], "new_segments": added, "sm_mhz": clocks,
            "peak_mb": round(peak_bytes / 2**20)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.fresh_runs", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--model-config", required=True)
    parser.add_argument("--weight-dir", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", choices=CASE_SETS, default="long")
    parser.add_argument("--case", action="append", help="only this case of the set (repeatable)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep-caches", action="store_true",
                        help="captures leave the allocator's caches as they are (no empty_cache)")
    args = parser.parse_args(argv)
    if args.keep_caches:
        keep_allocator_caches()
    config = json.loads(open(args.model_config).read())
    module = load_engine_module(args.engine)
    ramp_gpu_clocks(args.device)  # as the benchmark does before its cases
    for name, events in select_cases(args.cases).items():
        if not args.case or name in args.case:
            runs = case_runs(module, config, args.weight_dir, args.device, events, args.repeat)
            print(json.dumps({"engine": args.engine, "case": name, "keep_caches": args.keep_caches, **runs}),
                  flush=True)


if __name__ == "__main__":
    main()
