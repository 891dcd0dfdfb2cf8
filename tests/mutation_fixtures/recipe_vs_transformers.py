"""The fastest recipe's program against transformers on a CPU, its Triton kernels through
Triton's interpreter (a fresh process: TRITON_INTERPRET must be set before triton is imported).

    TRITON_INTERPRET=1 python tests/mutation_fixtures/recipe_vs_transformers.py FAMILY... [--with OPERATOR...]

For each family, a random bf16 checkpoint saved by transformers (tests/test_hf.py); prints
"ok FAMILY" once the program's prefill and decode logits match transformers' own. `--with`:
the recipe's program with these operators applied after it (an allele not in the recipe yet).
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"

import torch  # noqa: E402

from fitness.loader import load_engine_module  # noqa: E402
from mutations import recipe  # noqa: E402
from tests.test_hf import assert_engine_matches, make_checkpoint  # noqa: E402


def main(argv) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("families", nargs="+")
    parser.add_argument("--with", dest="operators", nargs="+", default=[])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp())
    steps = recipe.parse((REPO / "mutations" / "recipes" / "fastest.txt").read_text())
    program = root / "fastest.py"
    program.write_text(recipe.apply(steps + [recipe.Step(name) for name in args.operators]))
    for family in args.families:
        assert_engine_matches(load_engine_module(program), make_checkpoint(root / family, family, torch.bfloat16))
        print("ok", family, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
