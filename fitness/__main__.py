"""python -m fitness {judge,check,bench,roofline} ... — see README.md."""
import argparse
import json
import sys
from pathlib import Path

from fitness import gate
from fitness.devices import resolve_device
from target.toy_weights import HERE as TARGET_DIR, ensure as ensure_toy_weights

TOY_WEIGHT_DIR = TARGET_DIR / "weights"


def prepare_weights(config_path, weight_dir) -> None:
    """The repository's own toy weights are generated when missing; nothing else is."""
    if Path(weight_dir).resolve() == TOY_WEIGHT_DIR.resolve():
        ensure_toy_weights(config_path, weight_dir)


def add_target_arguments(parser, engine_flag: bool) -> None:
    if engine_flag:
        parser.add_argument("--engine", required=True, type=Path)
    parser.add_argument("--model-config", required=True, type=Path)
    parser.add_argument("--weight-dir", required=True, type=Path)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))


def cmd_judge(args) -> int:
    from fitness.sandbox import judge

    prepare_weights(args.model_config, args.weight_dir)
    verdict = judge(args.candidate, args.model_config, args.weight_dir, resolve_device(args.device),
                    timeout=args.timeout, seed=args.seed, scratch=args.scratch, margin=args.margin,
                    derived=not args.no_derived, bench=args.bench, repeat=args.repeat)
    print(json.dumps(verdict, indent=2))
    return 0 if verdict["status"] == "ok" else 1


def cmd_check(args) -> int:
    """The evaluator's check: every call within tolerance, on the target and derived configs."""
    import os
    import tempfile

    from fitness.judgement import error_text
    from fitness.loader import load_engine_module
    from fitness.model_config import ModelConfig

    prepare_weights(args.model_config, args.weight_dir)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    try:
        module = load_engine_module(args.engine)
        result = gate.run_gate(module, ModelConfig.load(args.model_config), args.weight_dir,
                               resolve_device(args.device), seed, args.scratch or tempfile.mkdtemp(),
                               args.margin, not args.no_derived)
    except Exception as err:
        print(json.dumps({"status": "failed", "case": "", "errors": [error_text(err)], "seed": seed}))
        return 1
    if not result.passed:
        print(json.dumps({"status": "failed", "case": result.case, "errors": [result.error],
                          "seed": seed}, indent=2))
        return 1
    print(json.dumps({"status": "passed", "calls_checked": result.num_calls,
                      "worst_error_ratio": result.worst_ratio, "worst_case": result.worst_case,
                      "configs": result.stages, "seed": seed}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from fitness import bench, roofline

    parser = argparse.ArgumentParser(prog="python -m fitness", description="The judge.")
    sub = parser.add_subparsers(dest="command", required=True)

    judge = sub.add_parser("judge", help="judge one file in a child process, print a JSON verdict")
    judge.add_argument("candidate", type=Path)
    add_target_arguments(judge, engine_flag=False)
    judge.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    judge.add_argument("--bench", default="public", choices=("none", "public", "hidden", "all"))
    judge.add_argument("--repeat", type=int, default=3)
    judge.set_defaults(run=cmd_judge, margin=gate.DEFAULT_MARGIN)

    check = sub.add_parser("check", help="the evaluator's correctness check, in this process")
    add_target_arguments(check, engine_flag=True)
    check.set_defaults(run=cmd_check, margin=1.0)

    for p in (judge, check):
        p.add_argument("--seed", type=int, default=None, help="token seed (default: fresh, printed)")
        p.add_argument("--margin", type=float, help="pass under this fraction of the tolerance "
                       "(judge 0.5, check 1.0: the evaluator's own limit)")
        p.add_argument("--no-derived", action="store_true", help="skip the derived configs")
        p.add_argument("--scratch", type=Path, help="where generated judging weights are kept")

    bench_parser = sub.add_parser("bench", help="the contract's throughput benchmark")
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
