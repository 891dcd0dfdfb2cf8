"""The kernels one decode call of an engine launches, by name, counted on a CPU: torch's ops
(views and allocations left out) and Triton's launches, which its interpreter runs here. A
GPU launches the same kernels (a CUDA graph replays them), so the count says where a
launch-bound step's launches go (docs/log/2026-11-29-shared-expert-in-two-kernels.md).

    python -m tools.probes.kernel_count --engine E --model-dir DIR [--rows 1] [--dtype float16] [--top 40]

DIR is a Hugging Face directory (config.json and its weights; `python -m target.hf_checkpoints
/tmp/hf --only tiny_qwen3_5_moe` makes a tiny hybrid). The engine is made on the CPU in `--dtype`
(float16 by default, so that the alleles take the paths they take on a GPU; the interpreter's
bf16 products are not exact), prefills `--rows` prompts of 7 tokens, decodes once, then the
next decode is counted.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: its kernels run on the CPU
import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from contract.loader import load_engine_module  # noqa: E402

NOT_KERNELS = {"view", "_unsafe_view", "reshape", "expand", "slice", "select", "unsqueeze", "squeeze", "t",
               "transpose", "permute", "split", "split_with_sizes", "chunk", "unbind", "narrow", "as_strided",
               "alias", "detach", "_reshape_alias", "lift_fresh", "empty", "empty_like", "empty_strided",
               "unflatten", "flatten", "view_as", "_local_scalar_dense"}


class Launches(TorchDispatchMode):
    """Counts torch's ops outside Triton's interpreter (which runs a kernel as torch ops)."""

    def __init__(self):
        super().__init__()
        self.counts, self.in_triton = collections.Counter(), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in NOT_KERNELS and not self.in_triton:
            self.counts["torch " + name] += 1
        return func(*args, **(kwargs or {}))

    def counting_triton(self, run):
        def counted(kernel, *args, **kwargs):
            self.counts["triton " + kernel.fn.__name__] += 1
            self.in_triton = True
            try:
                return run(kernel, *args, **kwargs)
            finally:
                self.in_triton = False
        return counted


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.kernel_count", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    module = load_engine_module(args.engine)
    module.compute_dtype = lambda model_config, device: getattr(torch, args.dtype)  # as a GPU's
    engine = module.create_engine(config, args.model_dir, "cpu")
    ids = list(range(args.rows))
    launches = Launches()
    run, InterpretedFunction.run = InterpretedFunction.run, launches.counting_triton(InterpretedFunction.run)
    try:
        with torch.no_grad():
            engine.prefill(ids, [torch.randint(0, config["vocab_size"], (7,)) for _ in ids])
            engine.decode(ids, torch.randint(0, config["vocab_size"], (args.rows,)))
            tokens = torch.randint(0, config["vocab_size"], (args.rows,))
            launches.counts.clear()
            with launches:
                engine.decode(ids, tokens)
    finally:
        InterpretedFunction.run = run
    total, layers = sum(launches.counts.values()), config["num_hidden_layers"]
    print(f"{total} kernels a decode of {args.rows} rows, {total / layers:.1f} a layer over {layers} layers")
    for name, count in launches.counts.most_common(args.top):
        print(f"{count:5d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
