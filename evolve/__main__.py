"""python -m evolve {run,report} ...

    python -m evolve run --model-config C --weight-dir W [--budget 10m] [--population N]
        [--generations N] [--workers N] [--device auto|cpu|cuda] [--seed-from PATH ...]
        [--from-seed-only] [--library DIR] [--library-top N] [--resume RUN_DIR] [--nsga2]
        [--runs-dir runs] [--workspace workspace]
        [--history history.csv] [--bench B] [--screen-bench B] [--rounds N] [--max-rounds N] [--no-derived]
        [--margin X] [--timeout 10m] [--final-top N] [--final-rounds N] [--no-staged-final] [--rng-seed N]
    python -m evolve report [history.csv] [--out DIR] [--recipe OUT.txt]

Defaults live in evolve/config.py (some depend on the device); a flag left out takes
them, or on --resume the resumed run's own settings.
"""
import argparse
import importlib
import os
import sys
from pathlib import Path

from contract.checkpoint import check_weight_files
from contract.devices import resolve_device
from contract.model_config import ConfigError, ModelConfig
from evolve import checkpoint
from evolve.config import BENCH_CHOICES, RunConfig, SettingsError, parse_duration
from evolve.population import seed_sources
from evolve.report import report
from evolve.search import run
from target.toy_weights import HERE as TARGET_DIR, ensure

# flag's dest -> (RunConfig field, conversion)
RENAMED = {"budget": ("budget_s", parse_duration), "timeout": ("timeout_s", parse_duration),
           "no_derived": ("derived", lambda given: not given),
           "no_staged_final": ("staged_final", lambda given: not given),
           "from_seed_only": ("library", lambda given: not given)}
NOT_SETTINGS = ("command", "resume", "operators", "run")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evolve", description="The search.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="evolve engines", argument_default=argparse.SUPPRESS)
    run.add_argument("--model-config", type=Path)
    run.add_argument("--weight-dir", type=Path)
    run.add_argument("--budget", help="wall clock for the whole run: 90s, 10m, 1h")
    run.add_argument("--population", type=int)
    run.add_argument("--generations", type=int, help="stop after this many (default: the budget decides)")
    run.add_argument("--workers", type=int, help="judgements at once (default: one per GPU, 1 on CPU)")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"))
    run.add_argument("--seed-from", type=Path, nargs="+",
                     help="engine files, earlier run directories or history.csv files")
    run.add_argument("--resume", type=Path, help="continue this run directory where it stopped")
    run.add_argument("--from-seed-only", action="store_true",
                     help="start from the seed alone, not from the library's recipes for the target")
    run.add_argument("--library", dest="library_dir", type=Path,
                     help="the run's own library of recipes, read beside mutations/recipes/ and given the "
                          "winner (default: library/ beside the history)")
    run.add_argument("--library-top", type=int, help="the most recipes of the library the first generation takes")
    run.add_argument("--nsga2", action="store_true", help="peak memory as a second objective")
    run.add_argument("--runs-dir", type=Path)
    run.add_argument("--workspace", type=Path)
    run.add_argument("--history", type=Path)
    run.add_argument("--bench", choices=BENCH_CHOICES, help="the throughput cases a full judgement times")
    run.add_argument("--screen-bench", choices=BENCH_CHOICES, help="... and a screen")
    run.add_argument("--rounds", type=int, help="timed rounds at least, each program beside its parent")
    run.add_argument("--max-rounds", type=int, help="timed rounds at most, until the ratio to the parent is clear")
    run.add_argument("--no-derived", action="store_true", help="skip the derived configs (faster)")
    run.add_argument("--margin", type=float, help="the gate's limit on the target weights, in the contract's "
                     "tolerances (default 0.5; above 1.0 the winner may fail the contract's own check)")
    run.add_argument("--timeout", help="per judgement: 300s, 10m")
    run.add_argument("--final-top", type=int, help="how many of the best to re-measure at the end")
    run.add_argument("--final-rounds", type=int, help="rounds at most of the final comparison with the seed")
    run.add_argument("--no-staged-final", action="store_true",
                     help="the final times each case only as the judge does, not also with its inputs staged "
                          "before the clock as the evaluator's protocol has them (a contender then replaces the "
                          "floor on the judge's ratio alone)")
    run.add_argument("--rng-seed", type=int)
    run.add_argument("--operators", default="mutations",
                     help="module providing random_mutation and crossover (default: mutations)")
    run.set_defaults(run=cmd_run)
    report = sub.add_parser("report", help="summarise a history.csv, with plots")
    report.add_argument("history", type=Path, nargs="?", default=Path("history.csv"))
    report.add_argument("--out", type=Path, help="where the plots go (default: next to the history)")
    report.add_argument("--recipe", type=Path, help="write the winner's lineage here, as a recipe that makes it "
                                                    "from the seed (python -m mutations recipe)")
    report.set_defaults(run=cmd_report)
    return parser


def given_settings(args) -> dict:
    """The RunConfig fields named on the command line, converted."""
    settings = {}
    for dest, value in vars(args).items():
        if dest in NOT_SETTINGS:
            continue
        name, convert = RENAMED.get(dest, (dest, lambda v: v))
        settings[name] = convert(value)
    return settings


def make_config(args):
    """The run's settings and, on --resume, the checkpoint they continue from."""
    given, state = given_settings(args), None
    if getattr(args, "resume", None):
        state = checkpoint.load(args.resume)
        given = {**state["config"], **given}
    for required in ("model_config", "weight_dir"):
        if required not in given:
            raise SettingsError(f"--{required.replace('_', '-')} is required (unless --resume)")
    device = resolve_device(given.pop("device", "auto"))
    return RunConfig.build(device, **given), state


def check_target(config) -> None:
    """Stop before any work when the config or weights cannot be judged."""
    model = ModelConfig.load(config.model_config)
    if Path(config.weight_dir).resolve() == (TARGET_DIR / "weights").resolve():
        ensure(config.model_config, config.weight_dir)  # the repository's own toy weights
    check_weight_files(model, config.weight_dir)
    if not Path(config.seed_engine).is_file():
        raise SettingsError(f"seed engine not found: {config.seed_engine}")


def load_operators(name: str) -> dict:
    module = importlib.import_module(name)
    missing = [f for f in ("random_mutation", "crossover") if not callable(getattr(module, f, None))]
    if missing:
        raise SettingsError(f"operator module {name} lacks {', '.join(missing)}")
    return {"mutate_fn": module.random_mutation, "mate_fn": module.crossover}


def cmd_run(args) -> int:
    try:
        config, state = make_config(args)
        check_target(config)
        seed_sources(config)  # a bad --seed-from is reported now, not after generation 0
        operators = load_operators(args.operators)
    except (ConfigError, SettingsError, FileNotFoundError, ValueError, ImportError) as err:
        print(f"evolve: error: {err}", file=sys.stderr)
        return 2
    return run(config, state, run_id=state["run_id"] if state else "", spent_before_s=process_age_s(), **operators)


# The most of a budget the process's start may take: where /proc's uptime and the process's
# start count from different boots (a container's own), a run must still get its time.
MAX_PROCESS_AGE_S = 120.0


def process_age_s() -> float:
    """Seconds since this process started, 0 where /proc cannot say: --budget is the whole
    run's, and importing torch and checking the target took ~10 s of a 20-minute GPU run that
    ended 21 s past its budget (docs/log/2026-12-01-twenty-minute-run-final-of-three.md)."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, in ticks since boot
        age = float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return 0.0
    return min(max(0.0, age), MAX_PROCESS_AGE_S)


def cmd_report(args) -> int:
    if not args.history.is_file():
        print(f"evolve: error: no history at {args.history}", file=sys.stderr)
        return 2
    return report(args.history, args.out, args.recipe)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
