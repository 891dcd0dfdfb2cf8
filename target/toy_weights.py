"""Toy weights in the contract's format: a plain dict of fp32 CPU tensors in `model.pt`.

The public initialisation is `torch.manual_seed(seed)`, then, in the order of
`contract.layout.weight_shapes`, `randn(shape) * 0.02` for every matrix and ones for every norm.

A config with the Hugging Face families' features adds q/k/v biases (`qkv_bias`), per-head
q/k norm weights (`qk_norm`) and drops `lm_head.weight` (`tie_word_embeddings`); those
biases and norm weights are drawn as their family says (`toy_weight` in contract/families/:
`randn * std` and `1 + randn / 2`), so that one read in another's place shows. A config
without them gives the same weights as before. After the draws a family may settle what its
tensors must hold together (`settle_toy_weights`: Qwen3-MoE's routers read a per-token code,
so that routing is decisive; contract/families/qwen3_moe.py).

`std="unit"` draws each matrix with std 1/sqrt(fan_in) instead. Small models judged
with the public 0.02 have logits so close to zero that `atol=1e-2` hides real faults;
unit-scaled weights keep attention and logits of order 1.

    python -m target.toy_weights [--config C] [--output W/model.pt] [--seed 1234]
"""
import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from contract.families import LAYOUTS
from contract.layout import weight_shapes

HERE = Path(__file__).resolve().parent
PUBLIC_STD = 0.02
DEFAULT_SEED = 1234


def generate(config: dict, seed: int = DEFAULT_SEED, std: float | str = PUBLIC_STD) -> dict:
    """The state dict; `std` is a float for every matrix, or "unit" for 1/sqrt(fan_in)."""
    torch.manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(config).items():
        drawn = drawn_by_its_family(name, shape, std)
        if drawn is not None:
            weights[name] = drawn
            continue
        if len(shape) == 1:
            weights[name] = torch.ones(shape)
            continue
        scale = 1.0 / math.sqrt(shape[1]) if std == "unit" else float(std)
        weights[name] = torch.randn(shape) * scale
    for family in LAYOUTS:
        if hasattr(family, "settle_toy_weights"):
            family.settle_toy_weights(config, weights, seed)
    return weights


def drawn_by_its_family(name: str, shape: tuple, std: float | str):
    """The tensor drawn as the family that adds it says (contract/families/), or None."""
    for family in LAYOUTS:
        drawn = family.toy_weight(name, shape, std)
        if drawn is not None:
            return drawn
    return None


def write(config: dict, output: Path, seed: int = DEFAULT_SEED, std: float | str = PUBLIC_STD) -> Path:
    """Generate and save atomically, so a killed run never leaves half a file."""
    return save_atomically(generate(config, seed, std), output)


def save_atomically(weights: dict, output: Path) -> Path:
    """torch.save, or safetensors' save_file for a .safetensors `output`."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(".tmp")
    if output.suffix == ".safetensors":
        save_file({name: t.contiguous() for name, t in weights.items()}, tmp, metadata={"format": "pt"})
    else:
        torch.save(weights, tmp)
    tmp.replace(output)
    return output


def ensure(config_path: Path, weight_dir: Path, seed: int = DEFAULT_SEED) -> Path:
    """Write `weight_dir/model.pt` from the config unless it is already there."""
    path = Path(weight_dir) / "model.pt"
    if not path.exists():
        write(json.loads(Path(config_path).read_text()), path, seed)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=HERE / "model_config.json")
    parser.add_argument("--output", type=Path, default=HERE / "weights" / "model.pt")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    path = write(json.loads(args.config.read_text()), args.output, args.seed)
    print(f"wrote {path} (seed {args.seed})")


if __name__ == "__main__":
    main()
