"""Gate cuda-only Triton children on CPU through Triton's interpreter (run in a fresh process:
TRITON_INTERPRET must be set before triton is imported).

    TRITON_INTERPRET=1 python tests/mutation_fixtures/interpret_gate.py CONFIG.json WEIGHT_DIR SCRATCH OPERATOR...

Prints one JSON line per operator: {"operator", "passed", "worst_ratio", "error", "seconds"}.
The gate runs without derived configs except GQA, head_dim 256 and the Hugging Face families'
features (q/k norms: the only config that reaches `norm_heads`), to keep the interpreter's
time in bounds.
"""
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

FULL = os.environ.get("INTERPRET_FULL") == "1"  # the batch-64 and long-prompt traces too (slow)
assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"

import mutations  # noqa: E402
from contract.loader import load_engine_module  # noqa: E402
from contract.model_config import ModelConfig, derived_configs  # noqa: E402
from fitness import gate  # noqa: E402
from fitness.reference_logits import References  # noqa: E402
from tests import triton_interpreter  # noqa: E402

triton_interpreter.install()  # the same interpreter, its per-launch cost cut


def judge(op_name, config, weight_dir, scratch) -> dict:
    seed_source = (REPO / "seed_engine" / "engine.py").read_text()
    result = mutations.get_operator(op_name).apply(seed_source, random.Random(0))
    path = Path(tempfile.mkdtemp()) / "child.py"
    path.write_text(result.source)
    module = load_engine_module(path)
    tally = gate.Tally(gate.DEFAULT_MARGIN)
    driver, references = gate.InProcessDriver(module, "cpu"), References("cpu")
    started = time.time()
    try:
        gate.check_traces(driver, references, config, weight_dir, 5, "target", tally, full=FULL)
        for name in ("gqa", "head_dim_256", "families"):
            cfg = derived_configs(config)[name]
            gate.check_traces(driver, references, cfg, gate.judging_weights(cfg, scratch), 5, name, tally, full=False)
        error = ""
    except Exception as err:  # a wrong answer or a crash: both are a failure here
        error = f"{type(err).__name__}: {err}"[:500]
    return {"operator": op_name, "passed": not error, "worst_ratio": tally.worst, "error": error,
            "seconds": round(time.time() - started, 1), "args": result.args}


def main(argv) -> int:
    config_path, weight_dir, scratch, *ops = argv
    config = ModelConfig.load(config_path)
    for op in ops:
        print(json.dumps(judge(op, config, Path(weight_dir), scratch)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
