"""python -m fitness {judge,check,bench,roofline} ... — see README.md."""
import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

from contract.families import FEATURES
from contract.devices import resolve_device
from contract.loader import load_engine_module
from contract.model_config import ModelConfig, config_file
from fitness import bench, gate, roofline
from fitness.candidate import adopt_orphans
from fitness.judge import BENCH_CHOICES, vouched_for
from fitness.sandbox import fresh_seed, judge
from fitness.verdict import error_text
from target.toy_weights import HERE as TARGET_DIR, ensure as ensure_toy_weights

TOY_WEIGHT_DIR = TARGET_DIR / "weights"


def prepare_weights(config_path, weight_dir) -> None:
    """The repository's own toy weights are generated when missing; nothing else is."""
    if Path(weight_dir).resolve() == TOY_WEIGHT_DIR.resolve():
        ensure_toy_weights(config_path, weight_dir)


def add_target_arguments(parser, engine_flag: bool) -> None:
    if engine_flag:
        parser.add_argument("--engine", required=True, type=Path)
    parser.add_argument("--model-config", required=True, type=config_file,
                        help="a config file, or a Hugging Face model directory")
    parser.add_argument("--weight-dir", required=True, type=Path)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))


def cmd_judge(args) -> int:
    prepare_weights(args.model_config, args.weight_dir)
    adopt_orphans()  # this process starts runners only: any other child is one a runner left
    verdict = judge(args.candidate, args.model_config, args.weight_dir, resolve_device(args.device),
                    timeout=args.timeout, seed=args.seed, scratch=args.scratch, margin=args.margin,
                    level="screen" if args.no_derived else "full", bench=args.bench,
                    baseline=args.baseline, min_rounds=args.rounds, max_rounds=max(args.rounds, args.max_rounds),
                    staged=args.staged, vouched=vouched_for([args.candidate, args.baseline] if args.vouch else []))
    print(json.dumps(verdict, indent=2))
    return 0 if verdict["status"] == "ok" else 1


def cmd_check(args) -> int:
    """The evaluator's check: every call within tolerance, on the target and derived configs.
    The engine runs in this process, as the public evaluator runs it."""
    prepare_weights(args.model_config, args.weight_dir)
    seed = args.seed if args.seed is not None else fresh_seed()
    try:
        module = load_engine_module(args.engine)
        # Derived configs' weights go to --scratch, kept; else to a folder removed at the end.
        scratch = contextlib.nullcontext(args.scratch) if args.scratch else \
            tempfile.TemporaryDirectory(prefix="check_weights_")
        with scratch as where:
            result = gate.check_module(module, ModelConfig.load(args.model_config), args.weight_dir,
                                       resolve_device(args.device), seed, where, args.margin, not args.no_derived)
    except gate.GateFailure as err:  # the engine raised on one config
        return print_failed(err.label, f"{err.where}: {error_text(err.cause)}", seed)
    except Exception as err:
        return print_failed("", error_text(err), seed)
    if not result.passed:
        return print_failed(result.case, result.error, seed)
    print(json.dumps({"status": "passed", "calls_checked": result.num_calls,
                      "worst_error_ratio": result.worst_ratio, "worst_case": result.worst_case,
                      "configs": result.stages, "seed": seed}, indent=2))
    return 0


def print_failed(case: str, error: str, seed: int) -> int:
    print(json.dumps({"status": "failed", "case": case, "errors": [error], "seed": seed}, indent=2))
    return 1


# What the derived configs hold a program to, and why: in `judge --help` and `check --help`.
CLOSED_OFF = ("The runner closes itself off before the candidate's code runs (fitness/isolation.py): it can "
              "write no file but its scratch and Triton's kernel cache, seen through an overlay (what it compiles "
              "joins the shared cache only with --vouch); it can signal or "
              "reschedule no other process; it holds no capability. A verdict's open_layers names what could not "
              "be closed on this machine (\"\" when nothing).")
DERIVED_CONFIGS = (
    "Past the target config, the gate runs derived configs: GQA, the other GPU dtype (bf16; fp16 for a bf16 "
    "target), other head_dims, more layers, and "
    "'families', with every family's feature on (contract/families/): "
    + ", ".join(f"{feature.name} ({feature.field})" for feature in FEATURES) + ". A program is held to all of "
    "them even on the contract's own model, which has none: a hidden evaluation or a `run.sh --model` run may "
    "bring them, and an allele that drops one would silently be wrong there. A failure there is at stage "
    "'derived', its case the config, and on 'families' the error names the features that fail alone. "
    "--no-derived leaves the derived configs out.")

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fitness", description="The judge.")
    sub = parser.add_subparsers(dest="command", required=True)

    judge_parser = sub.add_parser("judge", help="judge one file in a runner process, print a JSON verdict "
                                                "(for code you did not write)",
                                  description="Judge one file in a runner process of its own and print a JSON "
                                              "verdict. " + CLOSED_OFF + " " + DERIVED_CONFIGS)
    judge_parser.add_argument("candidate", type=Path)
    add_target_arguments(judge_parser, engine_flag=False)
    judge_parser.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    judge_parser.add_argument("--bench", default="public", choices=BENCH_CHOICES)
    judge_parser.add_argument("--baseline", type=Path, help="a program timed beside it, interleaved")
    judge_parser.add_argument("--rounds", type=int, default=3, help="timed rounds at least (default 3)")
    judge_parser.add_argument("--max-rounds", type=int, default=8,
                              help="beside a baseline: rounds at most, until the ratio is clear (default 8)")
    judge_parser.add_argument("--staged", action="store_true",
                              help="beside a baseline: time each case a second time with its inputs staged on "
                                   "the device before the clock, as the evaluator's protocol has them "
                                   "(staged_ratio; an engine could read ahead there, so a run only uses it to "
                                   "keep the floor)")
    judge_parser.add_argument("--vouch", action="store_true",
                              help="the candidate and the baseline are code you trust: the Triton kernels their "
                                   "runners compile join the shared cache (by default a program's new kernels "
                                   "are compiled anew each judgement: one could plant a kernel under a key "
                                   "another program compiles later)")
    judge_parser.set_defaults(run=cmd_judge, margin=gate.DEFAULT_MARGIN)

    check = sub.add_parser("check", help="the evaluator's correctness check, in this process",
                           description="The evaluator's correctness check, the engine in this process. "
                                       + DERIVED_CONFIGS)
    add_target_arguments(check, engine_flag=True)
    check.set_defaults(run=cmd_check, margin=1.0)

    for p in (judge_parser, check):
        p.add_argument("--seed", type=int, default=None, help="token seed (default: fresh, printed)")
        p.add_argument("--margin", type=float, help="pass under this fraction of the tolerance "
                       "(judge 0.5, check 1.0: the evaluator's own limit)")
        p.add_argument("--no-derived", action="store_true",
                       help="skip the derived configs (GQA, the other dtype, head_dims, depth, the family features: see above)")
        p.add_argument("--scratch", type=Path, help="where generated judging weights are kept")

    bench_parser = sub.add_parser(
        "bench", help="the contract's throughput benchmark, in this process: it trusts the engine",
        description="The contract's throughput protocol, in this process, as the public evaluator runs it. "
                    "It trusts the engine: the engine shares this process with the clock, and every input "
                    "is drawn before the engine is made, so an engine can read its inputs ahead or patch "
                    "the clock (fitness/adversaries/cheats.py). For code you did not write, use `python -m fitness judge`.")
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(run=lambda a: prepare_weights(a.model_config, a.weight_dir) or bench.cli(a))

    roof = sub.add_parser("roofline", help="speed-of-light bound for every benchmark case")
    roofline.add_arguments(roof)
    roof.set_defaults(run=roofline.cli)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
