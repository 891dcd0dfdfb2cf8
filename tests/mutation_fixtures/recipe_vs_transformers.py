"""The fastest recipe's program against transformers on a CPU, its Triton kernels through
Triton's interpreter (a fresh process: TRITON_INTERPRET must be set before triton is imported).

    TRITON_INTERPRET=1 python tests/mutation_fixtures/recipe_vs_transformers.py [PROGRAM.py] FAMILY...

For each family, a random bf16 checkpoint saved by transformers (tests/test_hf.py's, or
tests/test_moe.py's for qwen3_moe); prints "ok FAMILY" once the program's prefill and decode
logits match transformers' own.
"""
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"

import torch  # noqa: E402

from contract.loader import load_engine_module  # noqa: E402
from mutations import recipe  # noqa: E402
from tests.conftest import FASTEST  # noqa: E402
from tests import test_moe  # noqa: E402
from tests.test_hf import assert_engine_matches, make_checkpoint  # noqa: E402
from tests import triton_interpreter  # noqa: E402

triton_interpreter.install()  # the same interpreter, its per-launch cost cut


def checkpoint(folder, family):
    if family == "qwen3_moe":
        return test_moe.make_checkpoint(folder, torch.bfloat16)
    return make_checkpoint(folder, family, torch.bfloat16)


def main(args) -> int:
    """PROGRAM.py: the recipe's program as the caller replayed it (else replayed here)."""
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp())
    if args and args[0].endswith(".py"):
        program, families = Path(args[0]), args[1:]
    else:
        program, families = root / "fastest.py", args
        program.write_text(recipe.apply(recipe.parse(FASTEST.read_text())))
    for family in families:
        assert_engine_matches(load_engine_module(program), checkpoint(root / family, family))
        print("ok", family, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
