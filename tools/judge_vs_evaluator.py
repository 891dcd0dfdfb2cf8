"""Does the judge rank programs as the evaluator does? Each program's tokens/s over a
baseline's, per case, under both, side by side.

    python -m tools.judge_vs_evaluator --baseline B.py P1.py P2.py ... [--rounds 4]
        [--judge-rounds 6] [--judge-orders 2] [--staged] [--json OUT] [--model-config C --weight-dir W]

- evaluator: `python -m fitness bench` (the contract's protocol: a warm-up engine, fresh
  engines, median of three) in a fresh process per program, every program once a round,
  the order turned each round; a program's ratio is the median over rounds of its tokens/s
  over the baseline's in the same round.
- judge: the programs judged together beside the baseline in one warm judge
  (`Judge.judge_group` at the screen's level, as a search's generation 0 judges its library
  programs), exactly `--judge-rounds` rounds; a program's ratio is the median over rounds of
  the baseline's seconds over its own, per case. `--judge-orders 2` judges the group again in
  the reverse order (where a program stands in its group). `--staged`: the group judged with
  staged runs too (each case again with every input handed over before the clock, as a
  final is: fitness/README.md), their ratios in the `staged` columns.

The last columns are judge / evaluator (and staged / evaluator): 1.0 where it ranks as the
evaluator does.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from contract.devices import resolve_device
from fitness.judge import vouched_for
from fitness.sandbox import JudgeProcess
from tools.arguments import target_arguments


def bench_once(program: Path, config: Path, weight_dir: Path, device: str) -> dict:
    """case -> tokens/s of one fresh `fitness bench` process."""
    out = subprocess.run([sys.executable, "-m", "fitness", "bench", "--engine", str(program), "--model-config",
                          str(config), "--weight-dir", str(weight_dir), "--device", device],
                         capture_output=True, text=True, check=True).stdout
    return {r["case_name"]: r["tokens_per_second"] for r in json.loads(out)}


def evaluator_ratios(programs: list, baseline: Path, rounds: int, config, weight_dir, device) -> dict:
    """program name -> case -> [its tokens/s over the baseline's, a round each]."""
    everyone = [baseline] + programs
    ratios = {p.name: {} for p in programs}
    for index in range(rounds):
        shift = index % len(everyone)
        figures = {p.name: bench_once(p, config, weight_dir, device) for p in everyone[shift:] + everyone[:shift]}
        print(f"evaluator round {index + 1}: " + "; ".join(
            f"{name} " + " / ".join(f"{tps / 1e3:.1f}k" for tps in cases.values()) for name, cases in figures.items()),
            flush=True)
        for program in programs:
            for case, tps in figures[program.name].items():
                ratios[program.name].setdefault(case, []).append(tps / figures[baseline.name][case])
    return ratios


def judge_ratios(programs: list, baseline: Path, rounds: int, config, weight_dir, device, scratch,
                 staged: bool = False) -> tuple:
    """(program name -> case -> [baseline's seconds over its own, a round each], the same of
    the staged runs, empty unless `staged`), one group judgement."""
    cores = sorted(os.sched_getaffinity(0))  # as a search's one worker has them (evolve.judging)
    judge = JudgeProcess(device, {"OMP_NUM_THREADS": str(len(cores))}, ",".join(map(str, cores)), scratch)
    vouched = vouched_for([*programs, baseline])  # the library's: their kernels shared
    try:
        verdicts = judge.judge_group(programs, config, weight_dir, level="screen", bench="public",
                                     baseline=baseline, min_rounds=rounds, max_rounds=rounds, timeout=900,
                                     staged=staged, vouched=vouched)
    finally:
        judge.stop()
    ratios, staged_ratios = {}, {}
    for program, verdict in zip(programs, verdicts):
        if verdict["status"] != "ok":
            print(f"judge: {program.name} {verdict['status']} at {verdict['stage']}: {verdict['error'][-300:]}")
            continue
        ratios[program.name] = {case: [b / s for b, s in zip(verdict["baseline_timings"][case], seconds)]
                                for case, seconds in verdict["timings"].items()}
        if staged:
            staged_ratios[program.name] = {
                case: [b / s for b, s in zip(verdict["baseline_staged_timings"][case], seconds)]
                for case, seconds in verdict["staged_timings"].items()}
        print(f"judge: {program.name} " + " / ".join(f"{tps / 1e3:.1f}k" for tps in verdict["tokens_per_second"].values())
              + " beside the baseline's " + " / ".join(
                  f"{tps / 1e3:.1f}k" for tps in verdict["baseline_tokens_per_second"].values()), flush=True)
        if staged:
            print(f"staged: {program.name} {median_ms(verdict['staged_timings'])} ms beside the baseline's "
                  f"{median_ms(verdict['baseline_staged_timings'])}", flush=True)
    return ratios, staged_ratios


def median_ms(timings: dict) -> str:
    """Each case's median run in ms, "a / b / c"."""
    return " / ".join(f"{statistics.median(seconds) * 1e3:.3f}" for seconds in timings.values())


def spread(values: list) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.2f}-{max(values):.2f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.judge_vs_evaluator", description=__doc__.splitlines()[0])
    parser.add_argument("programs", type=Path, nargs="+")
    parser.add_argument("--baseline", type=Path, required=True)
    target_arguments(parser, device="auto")
    parser.add_argument("--rounds", type=int, default=4, help="evaluator rounds (default 4)")
    parser.add_argument("--judge-rounds", type=int, default=6, help="timed rounds of the group judgement")
    parser.add_argument("--judge-orders", type=int, default=1, choices=(1, 2))
    parser.add_argument("--staged", action="store_true", help="the group judged with staged runs too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    target = (args.model_config.resolve(), args.weight_dir.resolve(), device)
    judged = {}
    with tempfile.TemporaryDirectory(prefix="judge_vs_evaluator_") as scratch:
        for order in range(args.judge_orders):
            programs = args.programs if order == 0 else args.programs[::-1]
            ratios, staged = judge_ratios(programs, args.baseline, args.judge_rounds, *target, scratch, args.staged)
            judged[f"judge{order + 1}"] = ratios
            if args.staged:
                judged[f"staged{order + 1}"] = staged
    evaluated = evaluator_ratios(args.programs, args.baseline, args.rounds, *target)
    agreeing = [name for name in ("judge1", "staged1") if name in judged]
    print(f"\nover {args.baseline.name}, median (range) per case: evaluator | " + " | ".join(judged)
          + " | " + " | ".join(f"{name} / evaluator" for name in agreeing))
    for program in args.programs:
        for case, values in evaluated[program.name].items():
            cells = [spread(j[program.name][case]) if program.name in j else "failed" for j in judged.values()]
            agreement = []
            for name in agreeing:
                measured = judged[name].get(program.name, {}).get(case)
                agreement.append(f"{statistics.median(measured) / statistics.median(values):.3f}" if measured else "-")
            print(f"{program.name:28s} {case:8s} {spread(values)} | {' | '.join(cells)} | {' | '.join(agreement)}")
    if args.json:
        args.json.write_text(json.dumps({"baseline": args.baseline.name, "evaluator": evaluated, **judged}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
