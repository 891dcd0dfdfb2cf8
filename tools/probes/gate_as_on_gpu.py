"""The gate's target traces on a CPU with the engine and the references computed as on a GPU:
the compute dtype of every config (the engine's, the tie bound's, the allowance's) taken to be
the one a GPU computes it in (bf16 if it asks, otherwise fp16). A GPU verdict, reproduced
without one.

    python -m tools.probes.gate_as_on_gpu ENGINE DIR [--seed 1] [--by-config]
    python -m tools.probes.gate_as_on_gpu ENGINE SHAPE --derived fp16 [bf16 ...] [--seeds 1 2 3]

Prints the tie bound and the allowance the references find, then the verdict on the target's
own weights ("passed" with the worst error as a fraction of the limit, or the error); with
--by-config, each config of the full gate on its own. With --derived, the named derived
configs alone, at each token seed: they need no target weights (the judge draws theirs), so
SHAPE may be a name of target.hf_checkpoints (llama_3_2_1b, qwen3_5_35b_a3b, ...) or a directory.
"""
import argparse
import tempfile
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

from contract.loader import load_engine_module
from contract.model_config import ModelConfig, derived_configs
from fitness import gate
from fitness.reference_logits import References
from target.hf_checkpoints import CHECKPOINTS


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


def judged(check, driver, references, cfg, weight_dir, seed: int, label: str, tally) -> str:
    """One config's verdict in words: ok and its worst of the limit, or the error."""
    try:
        check(driver, references, cfg, weight_dir, seed, label, tally)
        return f"ok, worst {tally.worst:.3f} of the limit ({tally.worst_case})"
    except Exception as err:  # the verdict, whichever it is
        return f"{type(err).__name__}: {str(err)[:200]}"


def by_config(engine, folder, seed: int = 1):
    """Each config of the full gate's plan on its own, all in a GPU's dtype: a line each, its
    verdict (ok and its worst of the limit, or the error) and its allowance; a config that fails
    does not stop the others."""
    config, module = ModelConfig.load(folder), load_engine_module(engine)
    references, driver = References("cpu"), gate.InProcessDriver(module, "cpu")
    with engine_as_on_gpu(module), tempfile.TemporaryDirectory() as scratch:
        for _, label, cfg, weight_dir, check, stress in gate.correctness_plan(config, folder, Path(scratch), "full"):
            tally = gate.Tally(gate.stage_limit(gate.DEFAULT_MARGIN, stress))
            found = judged(check, driver, references, cfg, weight_dir, seed, label, tally)
            yield f"{label:14s} {cfg.torch_dtype:9s} allowance {references.allowance(cfg, weight_dir):7.1f}  {found}"


def derived(engine, shape: str, labels: list, seeds: list):
    """The derived configs `labels` of `shape` (a target.hf_checkpoints name, or a directory)
    alone, each at each token seed, in a GPU's dtype: a line each, its allowance and its
    verdict (ok and its worst of the evaluator's limit, or the error)."""
    config = ModelConfig.from_dict(CHECKPOINTS[shape]) if shape in CHECKPOINTS else ModelConfig.load(shape)
    module = load_engine_module(engine)
    configs = derived_configs(config)
    references, driver = References("cpu"), gate.InProcessDriver(module, "cpu")
    with engine_as_on_gpu(module), tempfile.TemporaryDirectory() as scratch:
        for label in labels:
            cfg = configs[label]
            weight_dir = gate.judging_weights(cfg, scratch)
            for seed in seeds:
                found = judged(partial(gate.check_traces, full=False), driver, references, cfg, weight_dir, seed,
                               label, gate.Tally(gate.STRESS_MARGIN))
                yield (f"{shape:16s} {label:12s} {cfg.torch_dtype:9s} seed {seed} "
                       f"allowance {references.allowance(cfg, weight_dir):6.1f}  {found}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine")
    parser.add_argument("model", help="a Hugging Face directory (with --derived, or a target.hf_checkpoints name)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--by-config", action="store_true", help="every config of the full gate, one line each")
    parser.add_argument("--derived", nargs="+", metavar="CONFIG", help="these derived configs alone (gqa, fp16, ...)")
    parser.add_argument("--seeds", type=int, nargs="+", help="with --derived: token seeds (default: --seed)")
    args = parser.parse_args(argv)
    if args.derived:
        for line in derived(args.engine, args.model, args.derived, args.seeds or [args.seed]):
            print(line, flush=True)
    elif args.by_config:
        for line in by_config(args.engine, args.model, args.seed):
            print(line, flush=True)
    else:
        print(verdict(args.engine, args.model, args.seed))


if __name__ == "__main__":
    main()
