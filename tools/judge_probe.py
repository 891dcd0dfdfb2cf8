"""Judging throughput and precision on one device.

First measured in docs/log/2026-11-22-judge-out-of-candidate-process.md.

    python -m tools.judge_probe --engines seed_engine/engine.py FAST.py [--repeats 5] [--json OUT]

With one judge kept warm (as a search keeps it), times: every engine judged at the
"full" level alone, `--repeats` times (seconds each, fitness and its spread across the
judgements: the CV of one program judged repeatedly); `--aa` judgements of the seed beside
itself (the ratio's interval should hold 1); the others judged at the "screen" and "full"
levels beside the first (the seed), paired, with the ratio and its interval.
"""
import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from contract.devices import resolve_device
from fitness.judge import Judge, vouched_for
from fitness.sandbox import fresh_seed
from tools.arguments import target_arguments


def geometric_mean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.judge_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", type=Path, required=True, help="the seed first")
    target_arguments(parser, device="auto")
    parser.add_argument("--bench", default="public")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--aa", type=int, default=0, help="judgements of the seed beside itself: does "
                        "the ratio's interval hold 1 as often as it should?")
    parser.add_argument("--alternate", action="store_true", help="judge the engines in turn (a, b, a, b...), "
                        "so drift between judgements shows as a common movement of both")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    judge = Judge(device)
    rows, seed = [], fresh_seed()
    # The engines are the repository's programs: their runners' kernels join the shared cache.
    target = dict(config_path=args.model_config, weight_dir=args.weight_dir, bench=args.bench, timeout=600,
                  vouched=vouched_for(args.engines))

    def record(label, engine, verdict, seconds):
        fitness = geometric_mean((verdict.get("tokens_per_second") or {}).values())
        row = {"label": label, "engine": str(engine), "status": verdict["status"], "stage": verdict["stage"],
               "seconds": round(seconds, 2), "fitness": round(fitness), "rounds": verdict.get("rounds"),
               "round_cv": verdict.get("fitness_cv"), "ratio": verdict.get("ratio"),
               "ratio_low": verdict.get("ratio_low"), "ratio_high": verdict.get("ratio_high"),
               "tps": verdict.get("tokens_per_second"), "error": verdict.get("error", "")[-400:],
               "phases": verdict.get("phases"), "timings": verdict.get("timings"),
               "baseline_timings": verdict.get("baseline_timings"), "at": round(time.time(), 2)}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("label", "engine", "status", "seconds", "fitness", "rounds", "ratio",
                                               "ratio_low", "ratio_high", "round_cv", "phases")}), flush=True)

    order = ([(i, e) for i in range(args.repeats) for e in args.engines] if args.alternate
             else [(i, e) for e in args.engines for i in range(args.repeats)])
    for i, engine in order:
        started = time.monotonic()
        verdict = judge.judge(engine, seed=seed, level="full", **target)
        record(f"full alone #{i}", engine, verdict, time.monotonic() - started)
    for engine in args.engines:
        fits = [r["fitness"] for r in rows if r["engine"] == str(engine) and r["label"].startswith("full alone")]
        if len(fits) > 1 and min(fits) > 0:
            print(f"{engine}: fitness over {len(fits)} judgements: mean {statistics.fmean(fits):,.0f}, "
                  f"CV {statistics.stdev(fits) / statistics.fmean(fits):.1%}", flush=True)
    for i in range(args.aa):
        started = time.monotonic()
        verdict = judge.judge(args.engines[0], seed=seed, level="screen", baseline=args.engines[0], **target)
        record(f"A/A #{i}", args.engines[0], verdict, time.monotonic() - started)
    for engine in args.engines[1:]:
        for level in ("screen", "full"):
            started = time.monotonic()
            verdict = judge.judge(engine, seed=seed, level=level, baseline=args.engines[0], **target)
            record(f"{level} beside the seed", engine, verdict, time.monotonic() - started)
    judge.close()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
