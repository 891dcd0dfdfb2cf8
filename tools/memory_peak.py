"""What is alive at a case's peak memory, and who allocated it.

    python -m tools.memory_peak --engine E --model-config C --weight-dir W --cases large [--case NAME] [--top 12]

Runs the benchmark's protocol for each case (a warm-up engine runs it once and stays alive,
the peak is reset, a fresh engine runs it) with the CUDA allocator's history recorded, then
replays that history to the moment of the highest allocated total after the reset. Every
block alive then is charged to the phase that allocated it (warm create, warm run, fresh
create, fresh run) and to the innermost line of the engine file on its stack; the phases
and the `--top` lines with the most bytes are printed, beside the contract's peak
(`max_memory_allocated`), which the replayed peak should equal.
"""
import json
from pathlib import Path

import torch

from contract.loader import load_engine_module
from fitness.bench import CASE_SEED, run_calls
from fitness.cases import select_cases
from fitness.traces import materialize
from tools.profile_case import case_arguments

PHASES = ("warm create", "warm run", "fresh create", "fresh run")


def trace_length() -> int:
    """How many allocator events have been recorded so far (on the current device)."""
    return len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()])


def live_at_peak(events, marks, after: int, owner) -> dict:
    """Replay allocator `events` (alloc / free_requested); the highest allocated total at or
    after event `after`, and the bytes alive then by (phase, owner(frames)). `marks` are the
    event indices where each phase of PHASES begins."""
    live, total, peak, at_peak = {}, 0, -1, {}
    for i, event in enumerate(events):
        if event["action"] == "alloc":
            phase = PHASES[max(p for p, mark in enumerate(marks) if mark <= i)]
            live[event["addr"]] = (event["size"], phase, owner(event.get("frames", [])))
            total += event["size"]
        elif event["action"] == "free_requested" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
        else:
            continue
        if i >= after and total > peak:
            peak, at_peak = total, dict(live)
    by_phase, by_line = {}, {}
    for size, phase, line in at_peak.values():
        by_phase[phase] = by_phase.get(phase, 0) + size
        by_line[(phase, line)] = by_line.get((phase, line), 0) + size
    return {"peak": peak, "by_phase": by_phase, "by_line": by_line}


def engine_line(engine_path: Path):
    """owner(frames): the innermost frame in the engine file, as 'function:line'."""
    name = str(engine_path.resolve())

    def owner(frames) -> str:
        for frame in frames:
            if frame.get("filename") and Path(frame["filename"]).resolve().as_posix() == name:
                return f"{frame['name']}:{frame['line']}"
        return "outside the engine"
    return owner


def measure(module, config, weight_dir, events, owner) -> dict:
    """The protocol of fitness.bench.run_case (one fresh run), recorded and replayed."""
    calls = materialize(events, config["vocab_size"], CASE_SEED, "cuda")
    torch.cuda.memory._record_memory_history(max_entries=10_000_000, stacks="python")
    marks = []
    with torch.no_grad():
        marks.append(trace_length())
        warm = module.create_engine(dict(config), str(weight_dir), "cuda")
        marks.append(trace_length())
        run_calls(warm, calls)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        marks.append(trace_length())
        engine = module.create_engine(dict(config), str(weight_dir), "cuda")
        marks.append(trace_length())
        run_calls(engine, calls)
        torch.cuda.synchronize()
        contract_peak = torch.cuda.max_memory_allocated()
    trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    torch.cuda.memory._record_memory_history(enabled=None)
    del engine, warm
    # Blocks allocated before recording began (none of the engines') are not replayed.
    return {"contract_peak": contract_peak, **live_at_peak(trace, marks, marks[2], owner)}


def main(argv=None) -> int:
    parser = case_arguments(__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=12, help="engine lines with the most bytes at the peak")
    args = parser.parse_args(argv)
    config = json.loads(args.model_config.read_text())
    module = load_engine_module(args.engine)
    cases = select_cases(args.cases)
    mb = 2 ** 20
    for name in args.case or cases:
        found = measure(module, config, args.weight_dir, cases[name], engine_line(args.engine))
        lines = sorted(found["by_line"].items(), key=lambda item: -item[1])[:args.top]
        print(json.dumps({
            "engine": str(args.engine), "case": name,
            "contract_peak_mb": round(found["contract_peak"] / mb, 1),
            "replayed_peak_mb": round(found["peak"] / mb, 1),
            "by_phase_mb": {phase: round(found["by_phase"].get(phase, 0) / mb, 1) for phase in PHASES},
            "top": [{"phase": phase, "line": line, "mb": round(size / mb, 1)} for (phase, line), size in lines],
        }), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
