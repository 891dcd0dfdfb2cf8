"""Skinny matmuls (a decode step's few rows times a weight) in Triton, for tools.probes.linear_bench:
the kernels an allele would carry, measured before one is written.

`skinny_matmul`: a program owns BLOCK_N output columns (and one of `split_k` shares of the
inner dimension), reads its weight slab in BLOCK_K-wide tiles and sums in fp32; split shares
are added by a second kernel before the one rounding to the compute dtype.

`prefetched_matmul`: the same product in the prefetched_linears rewrite's kernel, under
programmatic dependent launch (PDL, Hopper) or not: a program loads its whole weight share
first, since weights never depend on the kernel before it, then waits for that kernel
(`gdc_wait`) and reads x. Launched with `launch_pdl=True`, it starts while its predecessor
finishes, so the launch and the weight's memory latency overlap the kernel before.
"""
import torch
import triton
import triton.language as tl

from mutations.rewrites.kernels.prefetched_linear import prefetched_linear_kernel, sum_shares_kernel

SKINNY_PROGRAMS = 264  # programs a call aims for (two per SM of an H100)


@triton.jit
def skinny_matmul_kernel(x_ptr, w_ptr, out_ptr, num_rows, num_out, num_in, stride_x, stride_w, stride_out,
                         stride_split, split_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    row_ok, col_ok = rows < num_rows, cols < num_out
    share = tl.cdiv(tl.cdiv(num_in, split_k), BLOCK_K) * BLOCK_K  # whole tiles: shares never overlap
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(split * share, tl.minimum(split * share + share, num_in), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < num_in
        x = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + k[None, :], mask=col_ok[:, None] & k_ok[None, :],
                    other=0.0)  # [BLOCK_N, BLOCK_K]
        acc += tl.dot(x, tl.trans(w))
    out = out_ptr + split * stride_split + rows[:, None] * stride_out + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def skinny_plan(num_rows, num_out, num_in, programs=SKINNY_PROGRAMS):
    """(BLOCK_N, BLOCK_K, SPLIT_K): the widest column block that still makes about `programs`
    programs, then as many inner-dimension shares as it takes to get there."""
    block_n = 64
    while block_n > 16 and triton.cdiv(num_out, block_n) < programs:
        block_n //= 2
    split_k = 1
    while split_k < 16 and triton.cdiv(num_out, block_n) * split_k * 2 <= programs and num_in // (2 * split_k) >= 256:
        split_k *= 2
    return block_n, 128 if num_rows <= 16 else 64, split_k


def prefetch_plan(num_rows, num_out, num_in, max_share=1024):
    """(BLOCK_N, SPLIT_K) for prefetched_matmul: 16 columns a program, the inner dimension cut
    into shares of at most `max_share` (a program holds its share of the weight in registers)."""
    return 16, triton.cdiv(num_in, max_share)


def outputs(x, num_out, split_k) -> tuple:
    """(out [M, N] in x's dtype, where the kernel writes: out itself, or fp32 shares [split_k, M, N])."""
    out = torch.empty(x.shape[0], num_out, device=x.device, dtype=x.dtype)
    part = out if split_k == 1 else torch.empty(split_k, x.shape[0], num_out, device=x.device, dtype=torch.float32)
    return out, part


def sum_splits(part, out, split_k, pdl):
    sum_shares_kernel[(out.shape[0], triton.cdiv(out.shape[1], 1024))](
        part, out, out.shape[1], part.stride(0), part.stride(1), out.stride(0), SPLITS=split_k, BLOCK=1024,
        PDL=pdl, launch_pdl=pdl)


def skinny_matmul(x, weight, block_n, block_k, split_k, num_warps=4, num_stages=4):
    """x [M, K] @ weight [N, K].T in the Triton kernel with the given blocks and shares."""
    num_rows, num_in = x.shape
    num_out = weight.shape[0]
    out, part = outputs(x, num_out, split_k)
    block_m = max(16, triton.next_power_of_2(num_rows))
    skinny_matmul_kernel[(triton.cdiv(num_out, block_n), split_k)](
        x, weight, part, num_rows, num_out, num_in, x.stride(0), weight.stride(0), part.stride(-2),
        part.stride(0) if split_k > 1 else 0, split_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages)
    if split_k > 1:
        sum_splits(part, out, split_k, False)
    return out


def prefetched_matmul(x, weight, block_n, split_k, pdl=True, num_warps=4, one_row=None):
    """x [M, K] @ weight [N, K].T, each program's weight share loaded before it waits on the
    kernel before it (launched with PDL when `pdl`); one row summed in registers unless
    `one_row` is False (then a tensor-core tile, as for several rows)."""
    num_rows, num_in = x.shape
    num_out = weight.shape[0]
    share = triton.cdiv(num_in, split_k)
    out, part = outputs(x, num_out, split_k)
    prefetched_linear_kernel[(triton.cdiv(num_out, block_n), split_k)](
        x, weight, part, num_rows, num_out, num_in, x.stride(0), weight.stride(0), part.stride(-2),
        part.stride(0) if split_k > 1 else 0, share, BLOCK_M=max(16, triton.next_power_of_2(num_rows)),
        BLOCK_N=block_n, SHARE=max(16, triton.next_power_of_2(share)), PDL=pdl, num_warps=num_warps,
        ONE_ROW=num_rows == 1 if one_row is None else one_row, launch_pdl=pdl)
    if split_k > 1:
        sum_splits(part, out, split_k, pdl)
    return out
