"""How many rows the gate's near-tie rule leaves checked on a Qwen3-MoE checkpoint when the
tie bound is the one a judge computing in `--dtype` would use (fitness/reference_logits.py).

    python -m tools.probes.moe_tie_rows DIR [--dtype bfloat16] [--device cpu] [--generated unit|0.02]

The bound is measured as the judge measures it (the router's noise from fp32 to `--dtype`
on the public sequence, x TIE_HEADROOM), here on `--device`, so a CPU shows what a GPU
judge's bf16 bound does to the rule. `--generated STD`: on the weights the gate generates
for DIR's config and its derived ones (fitness/gate.py's generated_weights) instead. Printed per gate trace: rows, rows with their own
alternatives, rows with a reach, rows excused, and the largest reach in tolerances.
"""
import argparse
import json
import tempfile

import torch

from contract.model_config import ModelConfig, derived_configs
from fitness import reference_logits
from fitness.gate import generated_weights
from fitness.tolerance import in_tolerances
from fitness.traces import gate_traces


def trace_rows(references, config, folder, events, seed: int) -> dict:
    expected = references.trace(config, folder, events, seed)
    rules = [(rule, row) for call, rows in zip(references.trace_rules(config, folder, events, seed), expected)
             if call is not None for rule, row in zip(call, rows)]
    reach = [in_tolerances(rule.reach, row) for rule, row in rules if rule.reach is not None]
    return {"rows": len(rules), "own_ties": sum(bool(rule.alternatives) for rule, _ in rules),
            "with_reach": len(reach), "excused": sum(rule.excused for rule, _ in rules),
            "largest_reach": round(max(reach, default=0.0), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--generated", help="unit, or a float std")
    args = parser.parse_args()
    config, dtype = ModelConfig.load(args.folder), getattr(torch, args.dtype)
    if args.generated is None:
        return report(config, args.folder, dtype, args.device)
    std = args.generated if args.generated == "unit" else float(args.generated)
    with tempfile.TemporaryDirectory() as scratch:
        for name, derived in {"target": config, **derived_configs(config)}.items():
            print(json.dumps({"config": name}))
            report(derived.derive(torch_dtype="float32"), generated_weights(derived, scratch, std), dtype, args.device)


def report(config: ModelConfig, folder, dtype, device: str) -> None:
    """The bound `dtype` gives on `folder`, and each gate trace's rows."""
    references = reference_logits.References(device)
    exact, rounded = references.model(config, folder, torch.float32), references.model(config, folder, dtype)
    bound = reference_logits.TIE_HEADROOM * reference_logits.router_noise(
        exact, rounded, reference_logits.public_lives(config))
    references.tie_bounds[reference_logits.model_key(config, folder)] = bound
    print(json.dumps({"dtype": str(dtype), "tie_bound": bound, "allowance": references.allowance(config, folder)}))
    for name, events in gate_traces(0, config.max_position_embeddings, True).items():
        print(json.dumps({"trace": name, **trace_rows(references, config, folder, events, 0)}), flush=True)


if __name__ == "__main__":
    main()
