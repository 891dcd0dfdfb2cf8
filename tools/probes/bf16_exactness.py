"""Whether the RoPE and SwiGLU kernels round bf16 as the reference's torch ops do, bit for bit.

    python -m tools.probes.bf16_exactness [--tokens 1 64 4096]

Every program is gated on the contract's bf16 config, where the passing programs match the
reference exactly. RoPE's kernels once missed by 1.01x the tolerance although they round
each product as torch does (docs/log/2026-11-22-prefill-cuda-graphs-one-kernel-rope.md): ptxas fused
a product written
without a rounding mode into the 16-bit add after its cast, until the products went through
mul_rn (docs/log/2026-11-27-weights-into-l2-ahead.md,
2026-11-28-bf16-rope-through-kernels-exact.md). Here each kernel runs on random bf16 inputs
of the real shapes, with bf16 tables, beside the torch ops it replaces; printed per shape:
the elements that differ, the largest difference and the largest value. SwiGLU as the
allele computes it and as a kernel written with torch's own arithmetic (CUDA's expf,
through libdevice, and an IEEE-rounded division) computes it.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from contract.loader import load_engine_module
from mutations.program import SEED_PATH
from mutations.alleles import load_module as load_allele

EXP = tl if os.environ.get("TRITON_INTERPRET") == "1" else libdevice  # the interpreter has no libdevice
# (name, query heads, K/V heads, head_dim, intermediate size)
SHAPES = [("public", 4, 4, 192, 2048), ("Llama-3.2-1B", 32, 8, 64, 8192), ("Qwen3-0.6B", 16, 8, 128, 3072)]


@triton.jit
def torch_swiglu_kernel(gate_up_ptr, out_ptr, width, BLOCK: tl.constexpr):
    """silu(gate) * up with torch's CUDA arithmetic, each op rounded as torch rounds it."""
    t = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = i < width
    gate = tl.load(gate_up_ptr + t * 2 * width + i, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + t * 2 * width + width + i, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = tl.math.div_rn(gate, 1.0 + EXP.exp(-gate)).to(dtype).to(tl.float32)
    tl.store(out_ptr + t * width + i, (silu * up).to(dtype), mask=ok)


def differences(got: torch.Tensor, want: torch.Tensor) -> dict:
    """How many bf16 elements differ, and the largest difference against the largest value."""
    diff = (got.float() - want.float()).abs()
    return {"differ": int((got != want).sum()), "of": want.numel(), "max_diff": float(diff.max()),
            "max_value": float(want.float().abs().max())}


def rope_tables(tokens: int, head_dim: int, device):
    """The reference's bf16 tables: angles in fp32 on the device, rounded once."""
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(tokens, device=device, dtype=torch.float32) * 37 % 4096, inv_freq)
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 4096])
    args = parser.parse_args(argv)
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    torch.manual_seed(0)
    seed = load_engine_module(SEED_PATH)
    ropes = {name: load_allele("apply_rope", name) for name in ("triton", "triton_rows")}
    swiglu = load_allele("mlp", "swiglu_triton")
    for shape, heads, kv_heads, head_dim, width in SHAPES:
        for tokens in args.tokens:
            row = {"shape": shape, "tokens": tokens}
            x = torch.randn(tokens, heads + kv_heads, head_dim, device=device).to(torch.bfloat16)
            cos, sin = rope_tables(tokens, head_dim, device)
            want = seed.apply_rope(x, cos, sin)  # the reference's ops
            for name, module in ropes.items():
                kernel = module.rope_kernel if name == "triton" else module.rope_rows_kernel
                got = module.launch_rope(kernel, x, cos, sin)
                row[f"rope.{name}"] = differences(got, want)
            gate_up = torch.randn(tokens, 2 * width, device=device).to(torch.bfloat16)
            gate, up = gate_up.chunk(2, dim=-1)
            want = F.silu(gate) * up
            grid = (tokens, triton.cdiv(width, swiglu.SWIGLU_BLOCK))
            got = gate_up.clone()
            swiglu.swiglu_kernel[grid](got, got, got.stride(0), got.stride(0), width, BLOCK=swiglu.SWIGLU_BLOCK)
            row["swiglu.allele"] = differences(got[:, :width], want)
            got = torch.empty_like(want)
            torch_swiglu_kernel[grid](gate_up, got, width, BLOCK=swiglu.SWIGLU_BLOCK)
            row["swiglu.torch_arithmetic"] = differences(got, want)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
