"""Judgements per minute with 1..N warm judges side by side, and how precise they stay.

    python -m tools.judge_throughput --engine FAST.py --baseline seed_engine/engine.py \
        --judgements 8 --workers 1 2 [--group 4] [--level screen] [--json OUT]

For each worker count: that many judge processes (fitness.sandbox.JudgeProcess), each on
its own GPU (round robin over the visible ones) and its own cores, as evolve/judging.py
starts them; `--judgements` judgements of the engine beside the baseline, spread over
them, the first per judge left out (it pays for references and weights once); with
`--group N`, N copies of the engine per request, judged together (Judge.judge_group) as
the search batches a generation's children. Prints
judgements per minute and the CV of the engine's fitness and of its ratio to the baseline
across judgements: timings taken side by side must stay as precise as timings taken alone.
"""
import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from contract.devices import resolve_device
from evolve.config import visible_gpus
from evolve.judging import core_shares
from fitness.judge import vouched_for
from fitness.sandbox import JudgeProcess
from tools.arguments import target_arguments
from tools.judge_probe import geometric_mean


def cv(values) -> float | None:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else None


def run(num_workers: int, args, device: str) -> dict:
    gpus = visible_gpus() or ["0"]
    shares = core_shares(sorted(os.sched_getaffinity(0)), num_workers)
    judges = [JudgeProcess(device, {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)],
                                    "OMP_NUM_THREADS": str(max(1, len(cpus)))}, ",".join(map(str, cpus)))
              for i, cpus in enumerate(shares)]
    options = dict(config_path=args.model_config, weight_dir=args.weight_dir, level=args.level, bench=args.bench,
                   baseline=args.baseline, seed=1234, timeout=600,
                   vouched=vouched_for([args.engine, args.baseline]))
    group = [args.engine] * args.group
    with ThreadPoolExecutor(num_workers) as pool:  # warm every judge: references, weights, runners
        list(pool.map(lambda j: j.judge_group(group, **options), judges))
        started = time.monotonic()
        requests = -(-args.judgements // args.group)
        answers = list(pool.map(lambda i: judges[i % num_workers].judge_group(group, **options), range(requests)))
        verdicts = [v for answer in answers for v in answer]
        seconds = time.monotonic() - started
    for judge in judges:
        judge.stop()
    ok = [v for v in verdicts if v["status"] == "ok"]
    fitness = [geometric_mean(v["tokens_per_second"].values()) for v in ok]
    ratios = [v["ratio"] for v in ok if v.get("ratio")]
    return {"workers": num_workers, "group": args.group, "judgements": len(verdicts), "ok": len(ok), "seconds": round(seconds, 1),
            "per_minute": round(60 * len(verdicts) / seconds, 2),
            "mean_request_s": round(statistics.fmean(v["seconds"] for v in verdicts), 1),
            "fitness_mean": round(statistics.fmean(fitness)) if fitness else None, "fitness_cv": cv(fitness),
            "ratio_mean": statistics.fmean(ratios) if ratios else None, "ratio_cv": cv(ratios),
            "errors": [v["error"][-300:] for v in verdicts if v["status"] != "ok"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.judge_throughput", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, default=Path("seed_engine/engine.py"))
    target_arguments(parser, device="auto")
    parser.add_argument("--level", default="screen", choices=("none", "screen", "full"))
    parser.add_argument("--bench", default="public")
    parser.add_argument("--judgements", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--group", type=int, default=1, help="engines judged together per request")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    results = []
    for num_workers in args.workers:
        results.append(run(num_workers, args, device))
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
