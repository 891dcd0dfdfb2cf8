"""The gate's target traces on a CPU with the engine and the references computed as on a GPU:
the compute dtype of every config (the engine's, the tie bound's, the allowance's) taken to be
the one a GPU computes in (bf16 for a bf16 checkpoint). A GPU verdict, reproduced without one.

    python -m tools.probes.gate_as_on_gpu ENGINE DIR [--seed 1]

Prints the tie bound and the allowance the references find, then the verdict on the target's
own weights ("passed" with the worst error as a fraction of the limit, or the error).
"""
import argparse

import torch

from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from fitness import gate
from fitness.reference_logits import References


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine")
    parser.add_argument("model", help="a Hugging Face directory")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    config = ModelConfig.load(args.model)
    on_gpu = config.compute_dtype("cuda")
    ModelConfig.compute_dtype = lambda self, device="cuda": on_gpu  # this process only
    module = load_engine_module(args.engine)
    module.compute_dtype = lambda model_config, device: on_gpu
    tally, references = gate.Tally(gate.DEFAULT_MARGIN), References("cpu")
    print(f"dtype {on_gpu}, tie bound {references.tie_bound(config, args.model) if config.num_experts else None}, "
          f"allowance {references.allowance(config, args.model):.3g}")
    try:
        gate.check_traces(gate.InProcessDriver(module, "cpu"), references, config, args.model, args.seed, "target",
                          tally, full=False, min_share=0)
        print(f"passed: worst {tally.worst:.3g} of the limit")
    except Exception as err:  # the verdict, whichever it is
        print(f"failed: {type(err).__name__}: {str(err)[:400]}")


if __name__ == "__main__":
    main()
