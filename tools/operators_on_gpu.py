"""Judge every operator's child of the seed on a GPU, one fresh process each, with the
seed's tokens/s and the speed-of-light bound beside them.

    python -m tools.operators_on_gpu [--model-config target/model_config.json] [--weight-dir target/weights]
        [--operators all|cuda|NAME,NAME] [--bench none|public] [--no-derived] [--seed N] [--json OUT]

For each operator: apply it to the seed (one that needs what the seed lacks, such as
tune_constant or a swap back to a seed allele, after the swap it names in `needs_swap`),
write the child, and judge it with `fitness.sandbox.judge` on cuda: the gate on the
target and derived configs, then the public benchmark. Prints one row per child: status,
failing stage, worst error as a fraction of the tolerance, public-case tokens/s and the
ratio to the seed's; the roofline row gives each case's bound on this GPU.
"""
import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import mutations
from contract.model_config import ModelConfig
from fitness import roofline
from fitness.__main__ import prepare_weights
from fitness.cases import public_cases
from fitness.judge import vouched_for
from fitness.sandbox import judge as sandbox_judge
from mutations import program

ROOT = program.SEED_PATH.parents[1]


def child_of_seed(name: str, seed: int = 0):
    """The operator's child of the seed (via the swap that gives it something to do)."""
    source = mutations.with_work_for(name, program.SEED_PATH.read_text())
    return mutations.get_operator(name).apply(source, random.Random(seed))


def selected(which: str) -> list:
    ops = mutations.all_operators()
    if which == "all":
        return [op.name for op in ops]
    if which == "cuda":
        return [op.name for op in ops if op.devices == "cuda"] + ["allele.Engine.cuda_graphs"]
    return which.split(",")


def judge(path, args) -> dict:
    # The seed and what the repository's operators make of it: their runners' kernels are shared.
    return sandbox_judge(path, args.model_config, args.weight_dir, args.device, timeout=args.timeout, seed=args.seed,
                         level="screen" if args.no_derived else "full", bench=args.bench, min_rounds=args.rounds,
                         vouched=vouched_for([path]))


def row(name, verdict, seed_tps) -> str:
    tps = verdict.get("tokens_per_second") or {}
    cells = [f"{tps[c]:9.0f} ({tps[c] / seed_tps[c]:4.2f}x)" if c in tps and seed_tps.get(c) else f"{'-':>17s}"
             for c in ("prefill", "decode", "mixed")]
    worst = verdict.get("worst_ratio")
    worst = f"{worst:.3f}" if isinstance(worst, (int, float)) else "-"
    return f"{name:40s} {verdict['status']:9s} {verdict.get('stage') or '':8s} {worst:>7s} " + " ".join(cells)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.operators_on_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", type=Path, default=ROOT / "target" / "model_config.json")
    parser.add_argument("--weight-dir", type=Path, default=ROOT / "target" / "weights")
    parser.add_argument("--operators", default="all", help="all, cuda (the cuda-only ones and the graphs engine), or names")
    parser.add_argument("--bench", default="public", choices=("none", "public"))
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (each a fresh engine per case)")
    parser.add_argument("--no-derived", action="store_true")
    parser.add_argument("--seed", type=int, default=7, help="token seed of every judgement")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script itself")
    parser.add_argument("--json", type=Path, help="also write every verdict here")
    args = parser.parse_args(argv)
    prepare_weights(args.model_config, args.weight_dir)
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    verdicts = {"seed": judge(program.SEED_PATH, args)}
    seed_tps = verdicts["seed"].get("tokens_per_second") or {}
    print(f"children in {workdir}; token seed {args.seed}")
    print(f"{'operator':40s} {'status':9s} {'stage':8s} {'worst':>7s} {'prefill tok/s':>17s} "
          f"{'decode tok/s':>17s} {'mixed tok/s':>17s}")
    print(row("seed", verdicts["seed"], seed_tps), flush=True)
    for name in selected(args.operators):
        result = child_of_seed(name)
        if isinstance(result, mutations.Declined):
            print(f"{name:40s} declined: {result.reason}", flush=True)
            continue
        path = workdir / f"{name}.py"
        path.write_text(result.source)
        verdicts[name] = dict(judge(path, args), args=result.args)
        print(row(name, verdicts[name], seed_tps), flush=True)
        if verdicts[name]["status"] != "ok":
            print(f"    {verdicts[name]['error'][-600:]}")
    print_roofline(args)
    if args.json:
        args.json.write_text(json.dumps(verdicts, indent=2, default=str))
    return 0 if all(v["status"] == "ok" for v in verdicts.values()) else 1


def print_roofline(args) -> None:
    try:
        config = ModelConfig.load(args.model_config)
        gpu = roofline.gpu_for_device(args.device)
        bounds = {name: roofline.case_bound(config, events, gpu)["tokens_per_second"]
                  for name, events in public_cases().items()}
        print(f"{'roofline (' + gpu + ')':58s} " + " ".join(f"{bounds[c]:17.0f}" for c in ("prefill", "decode", "mixed")))
    except Exception as err:  # the table above stands without it
        print(f"roofline unavailable: {err}")


if __name__ == "__main__":
    sys.exit(main())
