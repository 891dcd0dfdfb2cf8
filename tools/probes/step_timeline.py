"""Where a decode step's time goes, kernel by kernel: what each adds to the step's end.

    python -m tools.probes.step_timeline --engine E --model-config C --weight-dir W [--case NAME ...]

NAME: a case of `--cases` (default: large's decode_1x128x64).

Under programmatic dependent launch a kernel starts before the one ahead of it ends and
waits inside, so its own duration counts the wait. What it costs the step is how far it
moves the step's end: its end less the latest end before it ("adds"). The case's first run
of decode calls runs once under torch.profiler with a marker kernel before the first call
and after each: the kernels between two markers are a step. Kernels are named by what
they are and the two before them (the same kernel serves several projections); per name:
how often a step runs it, its median duration and median add, and the step's total of adds.
The profiler may itself slow the GPU: the step's span here is printed beside
`fitness bench --step-time`'s figure for the same engine in
docs/log/2026-11-27-batch-1-step-timeline-step-inputs.md.
"""
import json
import statistics
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from contract.loader import load_engine_module
from fitness.bench import CASE_SEED
from fitness.cases import select_cases
from fitness.traces import materialize, replay
from tools.profile_case import case_arguments

NOT_KERNELS = ("Memcpy", "Memset")  # copies are not steps of the chain
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel, launched before and after the decode calls


def short(name: str) -> str:
    return name.split("(")[0].split("<")[0].strip()[:48]


def step_table(steps: list) -> dict:
    """Per label: count a step, median duration and add (us), and a step's total add."""
    rows, spans = {}, []
    for step in steps:
        spans.append(max(k[2] for k in step) - step[0][1])
        frontier = step[0][1]
        names = [short(k[0]) for k in step]
        for i, (_, start, end) in enumerate(step):
            label = " < ".join(names[max(0, i - 2):i + 1][::-1])
            row = rows.setdefault(label, {"durations": [], "adds": []})
            row["durations"].append(end - start)
            row["adds"].append(max(0.0, end - frontier))
            frontier = max(frontier, end)
    n = len(steps)
    table = {label: {"per_step": len(row["adds"]) / n, "duration_us": round(statistics.median(row["durations"]), 2),
                     "add_us": round(statistics.median(row["adds"]), 2),
                     "step_add_us": round(sum(row["adds"]) / n, 1)}
             for label, row in rows.items()}
    return {"steps": n, "span_us": round(statistics.median(spans), 1),
            "kernels": dict(sorted(table.items(), key=lambda item: -item[1]["step_add_us"]))}


def decode_run(calls: list) -> tuple:
    """[first, end) of the case's first run of consecutive decode calls."""
    kinds = [call.event.kind for call in calls]
    if "decode" not in kinds:
        raise SystemExit("the case has no decode call: a step timeline needs one (tools.profile_case --top covers prefill)")
    first = kinds.index("decode")
    end = first
    while end < len(kinds) and kinds[end] == "decode":
        end += 1
    return first, end


def between_markers(kernels: list) -> list:
    """The kernels between each two consecutive marker kernels (one list per call), copies
    and markers left out; kernels sorted by start."""
    steps, current = [], None
    for kernel in kernels:
        if MARKER in kernel[0]:
            if current is not None:
                steps.append(current)
            current = []
        elif current is not None and not kernel[0].startswith(NOT_KERNELS):
            current.append(kernel)
    return steps


def timeline(module, config: dict, weight_dir: Path, events: list) -> dict:
    """step_table of a case's decode steps, on a fresh engine after one warm pass of the case.
    Markers cut the steps apart: cutting at the GPU's idle gaps worked at batch 1 and found
    no steps at batch 64 (Qwen3-0.6B, H100; cause not found)."""
    engine = module.create_engine(dict(config), str(weight_dir), "cuda")
    with torch.no_grad():
        for call in materialize(events, config["vocab_size"], CASE_SEED, "cuda"):  # warm: graphs, compiles
            replay(engine, call)
        calls = materialize(events, config["vocab_size"], CASE_SEED, "cuda")
        first, end = decode_run(calls)
        for call in calls[:first]:
            replay(engine, call)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(1000)
            for call in calls[first:end]:
                replay(engine, call)
                torch.cuda._sleep(1000)
            torch.cuda.synchronize()
    kernels = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[1])
    steps = between_markers(kernels)
    if len(steps) != end - first:
        raise SystemExit(f"{len(steps)} steps between markers for {end - first} decode calls")
    sizes = Counter(len(step) for step in steps)
    return {"kernels_a_step": dict(sizes), **step_table(steps)}


def main(argv=None) -> int:
    parser = case_arguments(__doc__.splitlines()[0])
    parser.set_defaults(cases="large")
    args = parser.parse_args(argv)
    config = json.loads(args.model_config.read_text())
    module = load_engine_module(args.engine)
    cases = select_cases(args.cases)
    for name in args.case or ["decode_1x128x64"]:
        table = timeline(module, config, args.weight_dir, cases[name])
        print(json.dumps({"engine": str(args.engine), "case": name, **table}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
