"""Where a decode step's time goes: variants of an engine with one part of every layer left out.

    python -m tools.probes.step_without ENGINE.py OUT_DIR [--parts attention combine mlp]

Writes OUT_DIR/without_PART.py for each part, to be benched beside ENGINE.py in fresh
processes (`python -m fitness bench --engine F --case decode_1x128x64 --step-time ...`). A
variant's logits are wrong (never gate one); everything it keeps runs as in ENGINE.py, CUDA
graphs and programmatic launch included, so the step's time less a variant's is what that
part costs where it runs, overlap and all. Without counters on the GPU, this placed Qwen3-0.6B's
batch-1 step (docs/log/2026-11-27-qwen3-batch-1-step-by-leaving-parts-out.md). Parts:

  attention  attention_inputs and attend (the attention gene's call): q goes straight to o
  combine    the split-KV decode's second kernel (triton_split_kv)
  mlp        the norm before the MLP and the MLP: the attention's output is the layer's

A part whose code is not in ENGINE.py exactly once is an error naming it.
"""
import argparse
import re
from pathlib import Path

# part -> (the pattern of what goes, what replaces it)
PARTS = {
    "attention": (re.compile(r"attention\(q, k, v, layer, cos, sin, self\.cache, step, i, self\.eps\)"),
                  "q.reshape(n, -1)"),
    "combine": (re.compile(r"    if splits > 1:[^\n]*\n +split_kv_combine_kernel\[\(batch, num_heads\)\]\(.*?\)\n",
                           re.S), ""),
    "mlp": (re.compile(r"out, x = norm_mlp\(x, (.+?), layer\[\"post_norm\"\], layer, self\.eps\)"), r"out = \1"),
}


def without(source: str, part: str) -> str:
    """`source` with `part` of every layer left out."""
    pattern, replacement = PARTS[part]
    found = len(pattern.findall(source))
    if found != 1:
        raise ValueError(f"{part}: its code is in the engine {found} times, not once")
    return pattern.sub(replacement, source)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=sorted(PARTS))
    args = parser.parse_args(argv)
    source = args.engine.read_text()
    args.out.mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        path = args.out / f"without_{part}.py"
        path.write_text(without(source, part))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
