"""The gate's target traces on a CPU with the engine and the references computed as on a GPU:
the compute dtype of every config (the engine's, the tie bound's, the allowance's) taken to be
the one a GPU computes it in (bf16 if it asks, otherwise fp16). A GPU verdict, reproduced
without one.

    python -m tools.probes.gate_as_on_gpu ENGINE DIR [--seed 1] [--by-config]

Prints the tie bound and the allowance the references find, then the verdict on the target's
own weights ("passed" with the worst error as a fraction of the limit, or the error); with
--by-config, each config of the full gate on its own.
"""
import argparse
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from fitness import gate
from fitness.reference_logits import References


@contextmanager
def dtypes_of_a_gpu():
    """Every ModelConfig computes in the dtype a GPU takes for it (bf16 if asked, otherwise
    fp16) on any device, until the block ends."""
    compute_dtype = ModelConfig.compute_dtype
    ModelConfig.compute_dtype = lambda self, device="cuda": compute_dtype(self, "cuda")
    try:
        yield
    finally:
        ModelConfig.compute_dtype = compute_dtype


@contextmanager
def engine_as_on_gpu(module):
    """The engine `module` and every ModelConfig compute in the dtype a GPU takes for each
    config, until the block ends (the module keeps it: it is loaded for this alone)."""
    engine_dtype = module.compute_dtype
    module.compute_dtype = lambda model_config, device: engine_dtype(model_config, "cuda")
    with dtypes_of_a_gpu():
        yield


def verdict(engine, folder, seed: int = 1) -> dict:
    """{"tie_bound", "allowance", "passed", "worst" (of the limit) or "error"} of `engine` (a
    path) on the target traces of the checkpoint in `folder`, all in a GPU's dtype."""
    config, module = ModelConfig.load(folder), load_engine_module(engine)
    tally, references = gate.Tally(gate.DEFAULT_MARGIN), References("cpu")
    with engine_as_on_gpu(module):
        bound = torch.as_tensor(references.tie_bound(config, folder)).flatten().tolist() if config.num_experts else None
        found = {"tie_bound": bound,
                 "allowance": references.allowance(config, folder)}
        try:
            gate.check_traces(gate.InProcessDriver(module, "cpu"), references, config, folder, seed, "target",
                              tally, full=False, min_share=0)
        except Exception as err:  # the verdict, whichever it is
            return {**found, "passed": False, "error": f"{type(err).__name__}: {str(err)[:400]}"}
    return {**found, "passed": True, "worst": tally.worst}


def by_config(engine, folder, seed: int = 1):
    """Each config of the full gate's plan on its own, all in a GPU's dtype: a line each, its
    verdict (ok and its worst of the limit, or the error) and its allowance; a config that fails
    does not stop the others."""
    config, module = ModelConfig.load(folder), load_engine_module(engine)
    references, driver = References("cpu"), gate.InProcessDriver(module, "cpu")
    with engine_as_on_gpu(module), tempfile.TemporaryDirectory() as scratch:
        for _, label, cfg, weight_dir, check, stress in gate.correctness_plan(config, folder, Path(scratch), "full"):
            tally = gate.Tally(gate.stage_limit(gate.DEFAULT_MARGIN, stress))
            try:
                check(driver, references, cfg, weight_dir, seed, label, tally)
                found = f"ok, worst {tally.worst:.3f} of the limit ({tally.worst_case})"
            except Exception as err:  # the verdict, whichever it is
                found = f"{type(err).__name__}: {str(err)[:200]}"
            yield f"{label:14s} {cfg.torch_dtype:9s} allowance {references.allowance(cfg, weight_dir):7.1f}  {found}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine")
    parser.add_argument("model", help="a Hugging Face directory")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--by-config", action="store_true", help="every config of the full gate, one line each")
    args = parser.parse_args(argv)
    if args.by_config:
        for line in by_config(args.engine, args.model, args.seed):
            print(line, flush=True)
    else:
        print(verdict(args.engine, args.model, args.seed))


if __name__ == "__main__":
    main()
