"""The rows the full gate leaves to check beside routing near-ties, in a GPU's dtype (imitated on
a CPU: tools.probes.gate_as_on_gpu), under today's one tie bound for every sparse layer and
under a bound per layer (each layer's own router noise), config by config.

    python -m tools.probes.tie_bound_by_layer DIR [DIR ...] [--seed 123]

A bound per layer is not what the gate does: this measures what it would change
(docs/log/2026-11-30-moe-committed-recipe-through-the-gate.md). Tried, it failed the seed engine
itself on the tests' Qwen3-MoE checkpoint (imitated): a quiet layer's bound is under an honest
engine's noise there (docs/log/2026-11-30-twenty-minute-run-ten-minute-qwen3-gate-seeds.md).
"""
import argparse
import tempfile
from pathlib import Path

import torch

import fitness.reference_logits as rl
from contract.model_config import ModelConfig
from fitness import gate, traces
from tools.probes.gate_as_on_gpu import dtypes_of_a_gpu


def noise_by_layer(exact, rounded, lives: list) -> torch.Tensor:
    """[sparse layers]: rl.router_noise taken per layer over the same positions, at least the
    rounding of `rounded`'s dtype at that layer's largest logit."""
    worst = None
    for tokens in lives:
        a, b, differs = rl.routes_apart(exact, rounded, tokens)
        change = (a - b).abs().amax(-1)  # [layers, T]
        if differs.any():
            upto = int(differs.any(0).nonzero()[0])
            layer = int(differs[:, upto].nonzero()[0])
            kept = torch.zeros_like(change, dtype=torch.bool)
            kept[:, :upto], kept[:layer + 1, upto] = True, True
            change = torch.where(kept, change, torch.zeros_like(change))
        floor = torch.finfo(rounded.dtype).eps * a.abs().amax((-1, -2))
        got = torch.maximum(change.amax(-1), floor)
        worst = got if worst is None else torch.maximum(worst, got)
    return 2 * worst


def checked_rows(folder: Path, by_layer: bool, seed: int) -> list:
    """(config label, its bound(s), rows left to check, rows) for each MoE config of the plan."""
    config, scratch, references = ModelConfig.load(folder), Path(tempfile.mkdtemp()), rl.References("cpu")
    found = []
    with dtypes_of_a_gpu():
        for _, label, cfg, weight_dir, *_ in gate.correctness_plan(config, folder, scratch, "full"):
            if not cfg.num_experts or label == "churn":
                continue
            if by_layer:
                exact = references.model(cfg, weight_dir, torch.float32)
                rounded = references.model(cfg, weight_dir, cfg.compute_dtype("cuda"))
                bound = rl.TIE_HEADROOM * noise_by_layer(exact, rounded, rl.public_lives(cfg))
                references.tie_bounds[rl.model_key(cfg, weight_dir)] = bound[:, None]  # life_logits broadcasts it
            checked = total = 0
            for events in traces.gate_traces(seed, cfg.max_position_embeddings, label == "target").values():
                rows = [rule for call in references.row_rules(cfg, weight_dir, events, seed, 0) if call is not None
                        for rule in call]
                checked, total = checked + sum(not rule.excused for rule in rows), total + len(rows)
            bounds = torch.as_tensor(references.tie_bound(cfg, weight_dir)).flatten().tolist()
            found.append((label, bounds, checked, total))
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="Hugging Face directories of MoE checkpoints")
    parser.add_argument("--seed", type=int, default=123)
    args = parser.parse_args(argv)
    for folder in args.models:
        for by_layer in (False, True):
            print(f"{folder.name}: {'a bound per layer' if by_layer else 'one bound'}", flush=True)
            for label, bounds, checked, total in checked_rows(folder, by_layer, args.seed):
                print(f"    {label:14s} bound {' '.join(f'{b:.3f}' for b in bounds):28s} checked {checked}/{total}", flush=True)


if __name__ == "__main__":
    main()
