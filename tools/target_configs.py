"""The model configs issue 8's targets name, with toy weights, for benchmarks on a GPU.

    python -m tools.target_configs OUT [--only twelve_layer|one_b]

writes OUT/<name>/model_config.json and OUT/<name>/weights/model.pt for
  twelve_layer  the public config with 12 layers, vocab 4096, max_position_embeddings 4096
                (the config seen in a hidden evaluation: ENGINE_CONTRACT.md)
  one_b         a 1B-class model: hidden 2048, 22 layers, 32 query / 4 KV heads of 64,
                intermediate 5632, vocab 32000 (1.1B parameters: 4.4 GB of fp32 weights)
Then, for instance: python -m fitness bench --model-config OUT/one_b/model_config.json
--weight-dir OUT/one_b/weights --cases large --roofline
"""
import argparse
import json
from pathlib import Path

from target import toy_weights

PUBLIC = json.loads((Path(__file__).resolve().parents[1] / "target" / "model_config.json").read_text())
CONFIGS = {
    "twelve_layer": {**PUBLIC, "num_hidden_layers": 12, "vocab_size": 4096, "max_position_embeddings": 4096},
    "one_b": {**PUBLIC, "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32,
              "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 5632, "vocab_size": 32000,
              "max_position_embeddings": 2048},
}


def write(out: Path, name: str) -> Path:
    """OUT/name's config and toy weights (kept when already there); the config's path."""
    folder = Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "model_config.json"
    config_path.write_text(json.dumps(CONFIGS[name], indent=2) + "\n")
    toy_weights.ensure(config_path, folder / "weights")
    return config_path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", choices=sorted(CONFIGS), action="append")
    args = parser.parse_args(argv)
    for name in args.only or CONFIGS:
        print(write(args.out, name))


if __name__ == "__main__":
    main()
