"""SwiGLU with gate and up from one matmul, and silu(gate) * up in one Triton kernel.

`mlp.fused` runs `F.silu(gate) * up` as two elementwise kernels, each a full pass over the
[N, intermediate] activations: on an H100 a 1B-class prefill of 16 x 1024 tokens spent
2 x 265 us a layer in them (docs/PERF.md), and a decode step two launches a layer. Here one
launch reads gate and up once and writes the product, with the reference's two ops' own
arithmetic: silu as torch's CUDA kernel computes it (fp32, CUDA's expf, an IEEE-rounded
division) rounded to the compute dtype, then the product rounded again. So bf16 takes the
kernel too: on bf16 checkpoints torch's two elementwise kernels cost 2 x 37 us a layer of a
16 x 1024 prefill on the Qwen3-0.6B shape (H200, docs/PERF.md). Triton's interpreter has
no libdevice, so on CPU the exponential is tl.exp.
The product overwrites the gate half in place (each program reads its gate and up before it
writes): the down projection reads it through its row stride, and no [N, intermediate]
tensor is allocated (on a 1B-class prefill of 4,096 tokens, 44 MB of peak memory).

One row (a batch-1 decode) folds the product into the down projection: each program loads
its columns' share of the down weight first (no kernel before it writes a weight), waits for
the kernel before it under programmatic dependent launch, then computes the whole row's
product with the same arithmetic and sums it against its columns in fp32, rounded once as a
matmul is. A launch a layer fewer: on an H100 Qwen3-0.6B's batch-1 step (intermediate
3,072) gained, while Llama-3.2-1B's (8,192) lost 0.23 ms, each program recomputing a product
twice as wide for fewer columns (docs/PERF.md, twenty-seventh session): hence FOLD_WIDTH.
"""
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

EXP = tl if os.environ.get("TRITON_INTERPRET") == "1" else libdevice  # whose exp the kernel calls

REQUIRES = {"load_weights": ("fused_gate_up", "fused_both")}
DEVICES = "cuda"

SWIGLU_BLOCK = 1024  # range: 256..4096; activations a program handles
SWIGLU_WARPS = 4  # range: 1..16; warps a program runs with (Triton's default: 4)
FOLD_WIDTH = 4096  # range: 512..16384; the widest intermediate a one-row product folds into the down projection
FOLD_ELEMENTS = 16384  # range: 4096..65536; down-weight elements a folding program holds (its columns x the width)


@triton.jit
def swiglu_kernel(gate_up_ptr, out_ptr, stride_gt, stride_ot, width, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = i < width
    gate = tl.load(gate_up_ptr + t * stride_gt + i, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + t * stride_gt + width + i, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = tl.math.div_rn(gate, 1.0 + EXP.exp(-gate)).to(dtype).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + i, (silu * up).to(dtype), mask=ok)


@triton.jit
def swiglu_down_kernel(gate_up_ptr, w_ptr, out_ptr, num_out, width, stride_w, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """out[cols] = (silu(gate) * up, rounded as swiglu_kernel rounds it) @ down[cols].T for one row."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    k_ok = k < width
    col_ok = cols < num_out
    # The weight first: no kernel before this one writes it.
    w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + k[None, :], mask=col_ok[:, None] & k_ok[None, :],
                other=0.0)
    if PDL:  # gate_up, and the output's memory, belong to the kernels before
        gdc_launch_dependents()
        gdc_wait()
    gate = tl.load(gate_up_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + width + k, mask=k_ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = tl.math.div_rn(gate, 1.0 + EXP.exp(-gate)).to(dtype).to(tl.float32)
    product = (silu * up).to(dtype).to(tl.float32)
    tl.store(out_ptr + cols, tl.sum(w.to(tl.float32) * product[None, :], axis=1).to(dtype), mask=col_ok)


def swiglu_down(gate_up, down, width):
    """One row's product folded into the down projection: [1, hidden]."""
    out = torch.empty(1, down.shape[0], device=gate_up.device, dtype=gate_up.dtype)
    block_k = triton.next_power_of_2(width)
    block_n = max(1, min(16, FOLD_ELEMENTS // block_k))
    swiglu_down_kernel[(triton.cdiv(down.shape[0], block_n),)](gate_up, down, out, down.shape[0], width,
                                                               down.stride(0), BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def mlp(x, layer):
    gate_up = x @ layer["gate_up"].T  # [N, 2 * intermediate]: gate, then up
    width = gate_up.shape[-1] // 2
    if x.shape[0] == 0:
        return gate_up[:, :width] @ layer["down"].T
    if x.shape[0] == 1 and width <= FOLD_WIDTH and layer["down"].stride(-1) == 1:
        return swiglu_down(gate_up, layer["down"], width)
    swiglu_kernel[(x.shape[0], triton.cdiv(width, SWIGLU_BLOCK))](gate_up, gate_up, gate_up.stride(0),
                                                                  gate_up.stride(0), width, BLOCK=SWIGLU_BLOCK,
                                                                  num_warps=SWIGLU_WARPS)
    return gate_up[:, :width] @ layer["down"].T
