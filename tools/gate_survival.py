"""A random walk from the seed: how often do children survive the judge's static stage and gate?

    python -m tools.gate_survival [--steps 200] [--crosses 50] [--seed 0] [--device cpu] [--derived] [--json]

The walk applies `random_mutation` (operators that run on the device) to the current
program `steps` times and, spread evenly among them, `crosses` crossovers with a program
visited earlier. It moves to a child that passes the gate and stays put otherwise, so it
explores correct programs the way a (1+1) search would, without fitness. Each distinct
child is judged once (cached by source hash): fitness.gate.static_problems, then
fitness.gate.check_module on a small config (derived configs only with --derived). Prints the
fraction of children passing each.

A measuring tool on top of the packages (tools/): the operators and crossover never import
fitness; this script does, to judge what they make.
"""
import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

import mutations
from contract.loader import load_engine_module, source_hash
from contract.model_config import ModelConfig
from fitness.gate import check_module, static_problems
from fitness.reference_logits import References
from mutations import program
from target.toy_weights import write as write_weights

SMALL_CONFIG = {  # tests/conftest.py's small model
    "model_type": "tiny_llama", "torch_dtype": "float16", "vocab_size": 256,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
    "max_position_embeddings": 160, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
}


class Judge:
    """Static stage and CPU gate of each distinct source, once."""

    def __init__(self, config: dict, weight_dir, scratch, device: str, derived: bool, seed: int = 11):
        self.config, self.weight_dir, self.scratch = ModelConfig.from_dict(config), Path(weight_dir), Path(scratch)
        self.device, self.derived, self.seed = device, derived, seed
        self.verdicts = {}
        self.references = References(device)  # one seed for every child: their logits computed once

    def __call__(self, source: str) -> dict:
        key = source_hash(source)
        if key not in self.verdicts:
            self.verdicts[key] = self.judge(source, key)
        return self.verdicts[key]

    def judge(self, source: str, key: str) -> dict:
        problems = static_problems(source)
        if problems:
            return {"static": False, "gate": False, "error": "; ".join(problems)}
        path = self.scratch / f"child_{key}.py"
        path.write_text(source)
        try:
            result = check_module(load_engine_module(path), self.config, self.weight_dir, self.device,
                                  self.seed, self.scratch, derived=self.derived, references=self.references)
            return {"static": True, "gate": result.passed, "error": result.error}
        except Exception as err:  # a crash is a failed gate
            return {"static": True, "gate": False, "error": f"{type(err).__name__}: {err}"[:300]}


def walk(judge, steps: int, crosses: int, seed: int, device: str, log=None) -> dict:
    """Run the walk; returns counts and the failures seen."""
    rng = random.Random(seed)
    current = program.SEED_PATH.read_text()
    visited = [current]
    schedule = ["cross" if crosses and (i + 1) % ((steps + crosses) // crosses) == 0 and i // ((steps + crosses) // crosses) < crosses
                else "mutate" for i in range(steps + crosses)]
    while schedule.count("cross") < crosses:
        schedule.append("cross")
    while schedule.count("mutate") < steps:
        schedule.append("mutate")
    counts = {"mutate": [0, 0, 0], "cross": [0, 0, 0]}  # children, static passes, gate passes
    declined, failures, operators = 0, [], {}
    for kind in schedule:
        for _ in range(50):  # a decline is retried: the figures count children
            if kind == "mutate":
                result = mutations.random_mutation(current, rng, device)
            else:
                result = mutations.crossover(current, rng.choice(visited), rng)
            if isinstance(result, mutations.Applied):
                break
            declined += 1
        else:
            continue
        verdict = judge(result.source)
        tally = counts[kind]
        tally[0] += 1
        tally[1] += verdict["static"]
        tally[2] += verdict["gate"]
        operators.setdefault(result.operator, [0, 0])
        operators[result.operator][0] += 1
        operators[result.operator][1] += verdict["gate"]
        if verdict["gate"]:
            current = result.source
            visited.append(current)
        else:
            failures.append({"operator": result.operator, "args": result.args, "error": verdict["error"]})
        if log:
            log(f"{kind:6s} {result.operator:40s} static={verdict['static']} gate={verdict['gate']}")
    children = sum(c[0] for c in counts.values())
    return {
        "children": children,
        "static_pass": sum(c[1] for c in counts.values()) / max(children, 1),
        "gate_pass": sum(c[2] for c in counts.values()) / max(children, 1),
        "by_kind": counts, "by_operator": operators, "declined": declined,
        "distinct_judged": len(judge.verdicts), "failures": failures,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gate_survival", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--crosses", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--derived", action="store_true", help="gate on the derived configs too (slower)")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--json", action="store_true", help="the report as one line of JSON, for tools and tests")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        # Tiny models: more threads buy nothing, and on a shared machine OpenMP threads
        # spinning against other processes made a 0.5 s gate take 90 s.
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="mutation_walk_") as scratch_name:
        scratch = Path(scratch_name)
        write_weights(SMALL_CONFIG, scratch / "weights" / "model.pt", seed=1234)
        judge = Judge(SMALL_CONFIG, scratch / "weights", scratch, args.device, args.derived)
        started = time.time()
        report = walk(judge, args.steps, args.crosses, args.seed, args.device,
                      log=(lambda line: print(line, flush=True)) if args.verbose else None)
    seconds = time.time() - started
    print(json.dumps({**report, "seconds": seconds}) if args.json else format_report(report, seconds, args.derived))
    return 0


def format_report(report: dict, seconds: float, derived: bool) -> str:
    lines = [f"walk: {report['children']} children ({report['by_kind']['mutate'][0]} rewrites, "
             f"{report['by_kind']['cross'][0]} crossovers), {report['declined']} declines retried, "
             f"{report['distinct_judged']} distinct programs judged in {seconds:.0f} s "
             f"(gate {'with' if derived else 'without'} derived configs)",
             f"static stage pass: {report['static_pass']:.1%}",
             f"CPU gate pass:     {report['gate_pass']:.1%}"]
    for op, (n, ok) in sorted(report["by_operator"].items()):
        lines.append(f"  {op:40s} {ok}/{n}")
    for failure in report["failures"][:10]:
        lines.append(f"  failed: {json.dumps(failure)[:300]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
