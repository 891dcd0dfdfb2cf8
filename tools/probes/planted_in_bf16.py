"""The hybrid's planted faults (fitness.adversaries.planted.HYBRID) through the whole gate on a
Qwen3.5 checkpoint: on a CPU in fp32 (its own gate) and in bf16 as a GPU computes
(tools.probes.gate_as_on_gpu's imitation), or on a GPU as it judges. A fault the bf16 gate
passes is one a GPU search could keep.

    python -m tools.probes.planted_in_bf16 DIR [--device cpu|cuda] [--only NAME ...]

Prints one line per fault and dtype: rejected (at which stage and config, and the error that
failed: how near the limit a fault falls) or passed (its worst error, of the limit).
"""
import argparse
import tempfile
from contextlib import nullcontext
from pathlib import Path

from contract.devices import is_cuda
from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from fitness import gate
from fitness.adversaries import planted
from fitness.reference_logits import References
from tools.probes.gate_as_on_gpu import engine_as_on_gpu


def verdict(name: str, folder: Path, device: str, as_on_gpu: bool, references: References, scratch: Path) -> str:
    path = scratch / f"fault_{abs(hash(name))}.py"
    path.write_text(planted.hybrid_fault(name))
    module, config = load_engine_module(path), ModelConfig.load(folder)
    with engine_as_on_gpu(module) if as_on_gpu else nullcontext():
        result = gate.check_module(module, config, folder, device, 123, scratch, references=references)
    if result.passed:
        return f"PASSED, worst {result.worst_ratio:.2f} of the limit ({result.worst_case})"
    return f"rejected at {result.stage}/{result.case.split('/')[0]} ({result.error.rsplit(': ', 1)[-1]})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a Qwen3.5 Hugging Face directory")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="+", choices=sorted(planted.HYBRID), default=list(planted.HYBRID))
    args = parser.parse_args(argv)
    modes = ["cuda"] if is_cuda(args.device) else ["fp32", "bf16 as on a GPU"]
    for mode in modes:
        references = References(args.device)
        with tempfile.TemporaryDirectory() as scratch:  # derived weights: 21 GB at Qwen3.5-35B-A3B's width
            for name in args.only:
                line = verdict(name, args.model, args.device, mode.startswith("bf16"), references, Path(scratch))
                print(f"{mode:16s} {name:40s} {line}", flush=True)


if __name__ == "__main__":
    main()
