"""The prefetched_linears rewrite's helpers, which it copies into a program: a Triton kernel
for few rows by a small weight that loads its weight share before it waits on the kernel
before it, the kernel that sums its inner-dimension shares, and the dispatcher. Importable
(tools.probes.skinny_matmul times them; the CPU tests run them in Triton's interpreter)."""
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Programmatic dependent launch needs a Hopper or later GPU, and Triton's interpreter has none.
PDL_LAUNCH = (os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()
              and torch.cuda.get_device_capability()[0] >= 9)


@triton.jit
def prefetched_linear_kernel(x_ptr, w_ptr, out_ptr, num_rows, num_out, num_in, stride_x, stride_w, stride_out,
                             stride_split, share, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             SHARE: tl.constexpr, PDL: tl.constexpr = False, ONE_ROW: tl.constexpr = False):
    """out[:, cols] (or split's fp32 share of it) = x[:, share] @ w[cols, share].T. ONE_ROW
    (a batch-1 decode) multiplies and sums in fp32 registers: no tensor-core tile padded
    to 16 rows, no trip through shared memory."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    k = split * share + tl.arange(0, SHARE)
    k_ok = (tl.arange(0, SHARE) < share) & (k < num_in)
    col_ok = cols < num_out
    # The weight first: no kernel before this one writes it.
    w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + k[None, :], mask=col_ok[:, None] & k_ok[None, :],
                other=0.0)  # [BLOCK_N, SHARE]
    if PDL:  # x, and the output's memory, belong to the kernels before
        gdc_launch_dependents()
        gdc_wait()
    out = out_ptr + split * stride_split
    if ONE_ROW:
        x = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)  # [BLOCK_N]
        tl.store(out + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)
    else:
        x = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=(rows < num_rows)[:, None] & k_ok[None, :],
                    other=0.0)
        acc = tl.dot(x, tl.trans(w))  # fp32
        tl.store(out + rows[:, None] * stride_out + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=(rows < num_rows)[:, None] & col_ok[None, :])


@triton.jit
def sum_shares_kernel(part_ptr, out_ptr, num_out, stride_split, stride_part, stride_out, SPLITS: tl.constexpr,
                      BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[row] = the sum of the fp32 shares of row, rounded once."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < num_out
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(part_ptr + s * stride_split + row * stride_part + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


PREFETCH_ROWS = 16  # range: 1..64; the most rows a matmul takes through the prefetching kernel
PREFETCH_WEIGHT = 2621440  # range: 655360..10485760; the largest weight (elements) it takes for several rows
# One row (a batch-1 decode) sums in registers: on an H100 in bf16 it beat cuBLAS alone on 8 of
# the 10 Llama-3.2-1B / Qwen3-0.6B projections, lm_head included, and with no limit the batch-1
# step was faster than with 10.5 M elements (docs/log/2026-11-26-one-row-projections-in-triton.md).
PREFETCH_ONE_ROW_WEIGHT = 536870912  # range: 655360..536870912; the largest weight (elements) it takes for one row
PREFETCH_SHARE = 1024  # range: 256..2048; inner-dimension elements a program holds in registers
# One row may take a longer share in as many registers, in fewer columns a program (16 x
# PREFETCH_SHARE elements in all): up to the whole inner dimension, and then no second kernel
# sums the shares. On an H100 in bf16 one whole share beat 1,024-element shares summed on
# all 10 Llama-3.2-1B / Qwen3-0.6B projections (Qwen3's o 2.83 against 4.34 us, Llama's down
# 13.33 against 15.79; docs/log/2026-11-26-one-row-folds-llama-qwen3-step.md).
PREFETCH_ONE_ROW_SHARE = 8192  # range: 256..16384; inner-dimension elements a one-row program sums
# 8 were slower on both Llama-3.2-1B and Qwen3-0.6B (H100,
# docs/log/2026-11-27-swiglu-in-the-gate-up-projection.md).
PREFETCH_ONE_ROW_WARPS = 4  # range: 1..16; warps a one-row program runs with (Triton's default: 4)
# Several rows: every program reloads x's share, which wider column blocks (fewer programs)
# and more warps (more registers) offset. At 64 rows on an H100 no tiling beat cuBLAS
# (docs/log/2026-11-27-batch-64-projections-prefetching-kernel.md): tunables, at their old fixed
# values.
PREFETCH_ROWS_BLOCK_N = 16  # range: 16..128; output columns a program of several rows owns
PREFETCH_ROWS_WARPS = 4  # range: 1..16; warps a program of several rows runs with
# The second kernel, where the inner dimension was cut into shares: at its old fixed launch.
SUM_SHARES_BLOCK = 1024  # range: 256..4096; output columns a program sums the shares of
SUM_SHARES_WARPS = 4  # range: 1..16; warps a program summing the shares runs with (Triton's default: 4)


def prefetched_linear(x, weight):
    """x [M, K] @ weight [N, K].T: few rows by a small fp16 or bf16 weight in the prefetching
    kernel, PREFETCH_ROWS_BLOCK_N output columns a program (fewer for one row's longer
    shares) and the inner dimension in shares (summed in fp32 by a second kernel); anything
    else (fp32 among it) by torch."""
    if (x.dtype not in (torch.float16, torch.bfloat16) or weight.dtype != x.dtype or x.dim() != 2 or weight.dim() != 2
            or not 0 < x.shape[0] <= PREFETCH_ROWS
            or weight.numel() > (PREFETCH_ONE_ROW_WEIGHT if x.shape[0] == 1 else PREFETCH_WEIGHT)
            or x.stride(-1) != 1 or weight.stride(-1) != 1):
        return x @ weight.T
    num_rows, num_in = x.shape
    num_out = weight.shape[0]
    splits = triton.cdiv(num_in, PREFETCH_ONE_ROW_SHARE if num_rows == 1 else PREFETCH_SHARE)
    share = triton.cdiv(num_in, splits)
    block_share = max(16, triton.next_power_of_2(share))
    # One row: as many registers as 16 columns of PREFETCH_SHARE, in fewer columns of a longer share.
    block_n = PREFETCH_ROWS_BLOCK_N if num_rows > 1 else max(1, min(16, 16 * PREFETCH_SHARE // block_share))
    out = torch.empty(num_rows, num_out, device=x.device, dtype=x.dtype)
    part = out if splits == 1 else torch.empty(splits, num_rows, num_out, device=x.device, dtype=torch.float32)
    prefetched_linear_kernel[(triton.cdiv(num_out, block_n), splits)](
        x, weight, part, num_rows, num_out, num_in, x.stride(0), weight.stride(0), part.stride(-2),
        part.stride(0) if splits > 1 else 0, share, BLOCK_M=max(16, triton.next_power_of_2(num_rows)),
        BLOCK_N=block_n, SHARE=block_share, PDL=PDL_LAUNCH, ONE_ROW=num_rows == 1, launch_pdl=PDL_LAUNCH,
        num_warps=PREFETCH_ONE_ROW_WARPS if num_rows == 1 else PREFETCH_ROWS_WARPS)
    if splits > 1:
        sum_shares_kernel[(num_rows, triton.cdiv(num_out, SUM_SHARES_BLOCK))](
            part, out, num_out, part.stride(0), part.stride(1), out.stride(0), SPLITS=splits, BLOCK=SUM_SHARES_BLOCK,
            PDL=PDL_LAUNCH, launch_pdl=PDL_LAUNCH, num_warps=SUM_SHARES_WARPS)
    return out
