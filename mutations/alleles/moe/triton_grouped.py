"""A sparse layer's experts in two Triton grouped GEMMs: gate and up with SwiGLU in the epilogue, then down with the routing weight in its epilogue.

Program (slot, column block) of either kernel serves one expert and multiplies its pairs
(token, expert) by its weights, read in place, in tiles of BLOCK_M pairs on the tensor cores.
Up to MOE_HISTOGRAM_PAIRS pairs (a decode step), slot s serves the s-th expert that the
call's pairs name, in id order: the program counts the flat [N*k] ids in a histogram and
picks its expert's pairs by their rank among its own. That is the sort by expert, aligned to
the block, with no sort kernel, no count read back to the host and no launch per expert: the
step's MoE is three launches (the two kernels and the sum of each token's k outputs). Past it
(a prefill) every program would read too many ids: the pairs are sorted by expert once (a
stable argsort, counts by a scatter-add), and slot e serves expert e from its run. Either
way the shapes depend on N alone and nothing is read back to the host, so captured decode
and prefill graphs hold it. At batch 1 on Qwen3-30B-A3B, 8 slots read 8 experts; at 64 rows,
most of the 128.

The rounding is the seed's: gate and up each rounded to the compute dtype, silu_times
(shared.py), the down product rounded, then times the routing weight, rounded. The k
outputs are summed in fp32 and rounded once, where the seed's index_add rounds after each.
The tiles, blocks, warps and stages are knobs for three buckets of call size (FEW pairs,
MANY up to MOE_HISTOGRAM_PAIRS, SORTED past it), for the search to tune per target.

The sum of each token's k outputs is a Triton kernel too, so that under programmatic
dependent launch (the programmatic_launch rewrite) it and the kernel after it start early,
where torch's reduction broke the chain: on an H200 the batch-1 layer of Qwen3-30B-A3B's
shape took ~6 us less (docs/log/2026-11-30-moe-batch-1-sum-under-pdl.md).

A batch-1 decode (up to MOE_PAIR_PAIRS pairs) takes two other kernels, a pair at a time: a
program holds a few whole rows of its pair's expert in registers, every load issued at once,
and sums in fp32; down sums each token's k pairs itself, so the step's MoE is two launches.
The tiles padded one pair to BLOCK_M rows and filled a pipeline per program; on an H200 the
pair kernels took Qwen3-30B-A3B's 48-layer batch-1 step from 2.51 to 2.34 ms with the
recipe's warps (docs/log/2026-11-30-moe-experts-a-pair-at-a-time.md). Same rounding.
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

MOE_FEW_PAIRS = 64  # range: 8..1024; calls of up to this many pairs take the FEW knobs
MOE_HISTOGRAM_PAIRS = 1024  # range: 64..4096; past this many pairs a call sorts them first, and takes the SORTED knobs
MOE_FEW_BLOCK_M = 16  # range: 16..128; pairs of one expert a tile multiplies at once (few pairs)
MOE_FEW_BLOCK_N = 32  # range: 16..256; output columns a program owns (few pairs)
MOE_FEW_BLOCK_K = 128  # range: 32..512; inner-dimension elements a step of its loop reads (few pairs)
MOE_FEW_WARPS = 4  # range: 1..16; warps a program runs with (few pairs)
MOE_FEW_STAGES = 3  # range: 1..5, step 1; software-pipelining stages of its loop (few pairs)
MOE_MANY_BLOCK_M = 16  # range: 16..128; as above, many pairs
MOE_MANY_BLOCK_N = 32  # range: 16..256
MOE_MANY_BLOCK_K = 64  # range: 32..512
MOE_MANY_WARPS = 4  # range: 1..16
MOE_MANY_STAGES = 3  # range: 1..5, step 1
MOE_SORTED_BLOCK_M = 64  # range: 16..128; as above, sorted pairs
MOE_SORTED_BLOCK_N = 64  # range: 16..256
MOE_SORTED_BLOCK_K = 64  # range: 32..512
MOE_SORTED_WARPS = 4  # range: 1..16
MOE_SORTED_STAGES = 3  # range: 1..5, step 1
MOE_SUM_BLOCK = 1024  # range: 128..4096; output columns a program of the sum over a token's k outputs owns
MOE_SUM_WARPS = 4  # range: 1..16; warps a program of that sum runs with
# A pair at a time (see the docstring): on an H200, of the settings tried at batch 1 (Qwen3-30B-A3B's
# layer alone), 2 columns and 8 warps for gate/up and 1 column for down were fastest.
MOE_PAIR_PAIRS = 8  # range: 0..64; the most pairs multiplied a pair at a time (0: never)
MOE_PAIR_BLOCK_N = 2  # range: 1..32; intermediate columns of gate and up a program owns (a pair at a time)
MOE_PAIR_WARPS = 8  # range: 1..16; warps such a gate/up program runs with
MOE_PAIR_DOWN_BLOCK_N = 1  # range: 1..32; output columns a down program owns (a pair at a time)
MOE_PAIR_DOWN_WARPS = 4  # range: 1..16; warps such a down program runs with


@triton.jit
def slot_expert(ids_ptr, counts_ptr, num_pairs, NUM_BINS: tl.constexpr, BLOCK_P: tl.constexpr,
                SORTED: tl.constexpr):
    """(expert, mine [BLOCK_P], rank [BLOCK_P], count) of this program's slot. SORTED: expert
    slot and its count. Else the slot-th expert the first num_pairs ids name, which of the
    pairs are its own, each one's rank among them, and how many (past the experts named: 0)."""
    p = tl.arange(0, BLOCK_P)
    if SORTED:
        expert = tl.program_id(0)
        count = tl.load(counts_ptr + expert).to(tl.int32)
        mine, rank = p < 0, p  # unused
    else:
        ids = tl.load(ids_ptr + p, mask=p < num_pairs, other=NUM_BINS - 1).to(tl.int32)  # padding: the last bin
        counts = tl.histogram(ids, NUM_BINS)
        bins = tl.arange(0, NUM_BINS)
        named = (counts > 0) & (bins < NUM_BINS - 1)
        chosen = named & (tl.cumsum(named.to(tl.int32), 0) == tl.program_id(0) + 1)
        expert = tl.sum(tl.where(chosen, bins, 0), 0)
        count = tl.sum(tl.where(chosen, counts, 0), 0)
        mine = (ids == expert) & (p < num_pairs)
        rank = tl.cumsum(mine.to(tl.int32), 0) - 1
    return expert, mine, rank, count


@triton.jit
def tile_pairs(order_ptr, starts_ptr, expert, mine, rank, start, count, BLOCK_M: tl.constexpr,
               BLOCK_P: tl.constexpr, SORTED: tl.constexpr):
    """(pair [BLOCK_M], real [BLOCK_M]): the flat index of this expert's pairs start ..
    start + BLOCK_M - 1 (in its run of the sorted order, or by rank), and which exist."""
    rows = start + tl.arange(0, BLOCK_M)
    real = rows < count
    if SORTED:
        pair = tl.load(order_ptr + tl.load(starts_ptr + expert) + rows, mask=real, other=0).to(tl.int32)
    else:
        hit = mine[None, :] & (rank[None, :] == rows[:, None])  # [BLOCK_M, BLOCK_P]
        pair = tl.sum(tl.where(hit, tl.arange(0, BLOCK_P)[None, :], 0), 1)
    return pair, real


@triton.jit
def experts_gate_up_kernel(x_ptr, ids_ptr, order_ptr, counts_ptr, starts_ptr, gate_ptr, up_ptr, out_ptr,
                           num_pairs, top_k, width, num_in, stride_x, stride_we, stride_wn, stride_out,
                           NUM_BINS: tl.constexpr, BLOCK_P: tl.constexpr, SORTED: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           PRECISION: tl.constexpr):
    """out[pair, cols] = silu(x[token] @ gate[e, cols].T) * (x[token] @ up[e, cols].T) for every
    pair (token, e) of this slot's expert e, each product rounded to out's dtype first."""
    expert, mine, rank, count = slot_expert(ids_ptr, counts_ptr, num_pairs, NUM_BINS, BLOCK_P, SORTED)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < width
    gate_rows = gate_ptr + expert.to(tl.int64) * stride_we + cols[:, None].to(tl.int64) * stride_wn
    up_rows = up_ptr + expert.to(tl.int64) * stride_we + cols[:, None].to(tl.int64) * stride_wn
    dtype = out_ptr.dtype.element_ty
    for start in range(0, count, BLOCK_M):
        pair, row_ok = tile_pairs(order_ptr, starts_ptr, expert, mine, rank, start, count, BLOCK_M, BLOCK_P, SORTED)
        x_rows = x_ptr + (pair // top_k)[:, None].to(tl.int64) * stride_x
        gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, num_in, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < num_in
            x = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            ok = col_ok[:, None] & k_ok[None, :]
            gate += tl.dot(x, tl.trans(tl.load(gate_rows + k[None, :], mask=ok, other=0.0)), input_precision=PRECISION)
            up += tl.dot(x, tl.trans(tl.load(up_rows + k[None, :], mask=ok, other=0.0)), input_precision=PRECISION)
        out = silu_times(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), dtype)
        tl.store(out_ptr + pair[:, None].to(tl.int64) * stride_out + cols[None, :], out,
                 mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def experts_down_kernel(h_ptr, ids_ptr, order_ptr, counts_ptr, starts_ptr, down_ptr, weights_ptr, out_ptr,
                        num_pairs, width, num_in, stride_h, stride_we, stride_wn, stride_out,
                        NUM_BINS: tl.constexpr, BLOCK_P: tl.constexpr, SORTED: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PRECISION: tl.constexpr):
    """out[pair, cols] = (h[pair] @ down[e, cols].T) * weights[pair] for every pair of this
    slot's expert e: the product rounded to out's dtype, then the weighted one."""
    expert, mine, rank, count = slot_expert(ids_ptr, counts_ptr, num_pairs, NUM_BINS, BLOCK_P, SORTED)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < width
    down_rows = down_ptr + expert.to(tl.int64) * stride_we + cols[:, None].to(tl.int64) * stride_wn
    dtype = out_ptr.dtype.element_ty
    for start in range(0, count, BLOCK_M):
        pair, row_ok = tile_pairs(order_ptr, starts_ptr, expert, mine, rank, start, count, BLOCK_M, BLOCK_P, SORTED)
        h_rows = h_ptr + pair[:, None].to(tl.int64) * stride_h
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, num_in, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < num_in
            h = tl.load(h_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(down_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc += tl.dot(h, tl.trans(w), input_precision=PRECISION)
        weight = tl.load(weights_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
        out = (acc.to(dtype).to(tl.float32) * weight[:, None]).to(dtype)
        tl.store(out_ptr + pair[:, None].to(tl.int64) * stride_out + cols[None, :], out,
                 mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def sum_pairs_kernel(outs_ptr, out_ptr, width, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[t, cols] = the sum of outs[t * TOP_K + j, cols] over j, in fp32, rounded once."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        total += tl.load(outs_ptr + (t * TOP_K + j) * width + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * width + cols, total.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def pair_gate_up_kernel(x_ptr, ids_ptr, gate_ptr, up_ptr, out_ptr, top_k, width, num_in, stride_x, stride_we,
                        stride_wn, stride_out, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[pair, cols] as experts_gate_up_kernel's, for the pair program 0 names: its expert's
    rows whole (BLOCK_K covers the row), multiplied and summed in fp32 registers."""
    pair = tl.program_id(0)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    ok = (cols < width)[:, None] & (k < num_in)[None, :]
    rows = expert * stride_we + cols[:, None].to(tl.int64) * stride_wn + k[None, :]
    gate = tl.load(gate_ptr + rows, mask=ok, other=0.0)
    up = tl.load(up_ptr + rows, mask=ok, other=0.0)
    x = tl.load(x_ptr + (pair // top_k).to(tl.int64) * stride_x + k, mask=k < num_in, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    gate = tl.sum(gate.to(tl.float32) * x[None, :], 1).to(dtype).to(tl.float32)
    up = tl.sum(up.to(tl.float32) * x[None, :], 1).to(dtype).to(tl.float32)
    tl.store(out_ptr + pair.to(tl.int64) * stride_out + cols, silu_times(gate, up, dtype), mask=cols < width)


@triton.jit
def pair_down_kernel(h_ptr, ids_ptr, down_ptr, weights_ptr, out_ptr, width, num_in, stride_h, stride_we, stride_wn,
                     TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[t, cols] = the sum over token t's k pairs of (h[pair] @ down[e, cols].T, rounded)
    times the pair's weight, rounded as experts_down_kernel's epilogue rounds, added in fp32
    and rounded once as sum_pairs_kernel does: each pair's rows whole in registers."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    ok = (cols < width)[:, None] & (k < num_in)[None, :]
    dtype = out_ptr.dtype.element_ty
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = t * TOP_K + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        w = tl.load(down_ptr + expert * stride_we + cols[:, None].to(tl.int64) * stride_wn + k[None, :], mask=ok,
                    other=0.0)
        h = tl.load(h_ptr + pair * stride_h + k, mask=k < num_in, other=0.0).to(tl.float32)
        product = tl.sum(w.to(tl.float32) * h[None, :], 1).to(dtype).to(tl.float32)
        weight = tl.load(weights_ptr + pair).to(tl.float32)
        total += ROUNDED.mul_rn(product, weight).to(dtype).to(tl.float32)
    tl.store(out_ptr + t * width + cols, total.to(dtype), mask=cols < width)


def expert_knobs(pairs):
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the bucket a call of `pairs` pairs is in."""
    if pairs <= MOE_FEW_PAIRS:
        return MOE_FEW_BLOCK_M, MOE_FEW_BLOCK_N, MOE_FEW_BLOCK_K, MOE_FEW_WARPS, MOE_FEW_STAGES
    if pairs <= MOE_HISTOGRAM_PAIRS:
        return MOE_MANY_BLOCK_M, MOE_MANY_BLOCK_N, MOE_MANY_BLOCK_K, MOE_MANY_WARPS, MOE_MANY_STAGES
    return MOE_SORTED_BLOCK_M, MOE_SORTED_BLOCK_N, MOE_SORTED_BLOCK_K, MOE_SORTED_WARPS, MOE_SORTED_STAGES


def grouped_experts(x, weights, experts, layer):
    """The router-weighted sum [N, hidden] of each token's experts' SwiGLU (weights and
    experts [N, k]), by the two grouped kernels over the N*k pairs."""
    n, k = experts.shape
    pairs = n * k
    gate, up, down = layer["experts_gate"], layer["experts_up"], layer["experts_down"]
    num_experts, width, hidden = gate.shape
    ids = experts.reshape(-1)
    if pairs <= MOE_PAIR_PAIRS:
        return pair_by_pair(x, weights, ids, k, gate, up, down)
    block_m, block_n, block_k, warps, stages = expert_knobs(pairs)
    sorted_ = pairs > MOE_HISTOGRAM_PAIRS
    if sorted_:  # each expert's run of pair indices: order[starts[e] : starts[e] + counts[e]]
        order = torch.argsort(ids, stable=True)
        counts = torch.zeros(num_experts, device=x.device, dtype=torch.long).scatter_add_(0, ids, torch.ones_like(ids))
        starts, slots = counts.cumsum(0) - counts, num_experts
    else:
        order = counts = starts = ids  # unread
        slots = min(num_experts, pairs)
    shape = dict(NUM_BINS=triton.next_power_of_2(num_experts + 1), BLOCK_P=1 if sorted_ else triton.next_power_of_2(pairs),
                 SORTED=sorted_, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                 PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages)
    product = torch.empty(pairs, width, device=x.device, dtype=x.dtype)  # row t*k + j: token t's j-th expert's
    experts_gate_up_kernel[(slots, triton.cdiv(width, block_n))](
        x, ids, order, counts, starts, gate, up, product, pairs, k, width, hidden, x.stride(0), gate.stride(0),
        gate.stride(1), product.stride(0), **shape)
    outs = torch.empty(pairs, hidden, device=x.device, dtype=x.dtype)
    experts_down_kernel[(slots, triton.cdiv(hidden, block_n))](
        product, ids, order, counts, starts, down, weights.reshape(-1), outs, pairs, hidden, width,
        product.stride(0), down.stride(0), down.stride(1), outs.stride(0), **shape)
    total = torch.empty(n, hidden, device=x.device, dtype=x.dtype)
    sum_pairs_kernel[(n, triton.cdiv(hidden, MOE_SUM_BLOCK))](outs, total, hidden, TOP_K=k, BLOCK=MOE_SUM_BLOCK,
                                                              num_warps=MOE_SUM_WARPS)
    return total


def pair_by_pair(x, weights, ids, k, gate, up, down):
    """grouped_experts for a few pairs: the pair kernels, each expert's rows read once a pair."""
    width, hidden = gate.shape[1:]
    pairs, n = ids.numel(), ids.numel() // k
    product = torch.empty(pairs, width, device=x.device, dtype=x.dtype)
    pair_gate_up_kernel[(pairs, triton.cdiv(width, MOE_PAIR_BLOCK_N))](
        x, ids, gate, up, product, k, width, hidden, x.stride(0), gate.stride(0), gate.stride(1), product.stride(0),
        BLOCK_N=MOE_PAIR_BLOCK_N, BLOCK_K=triton.next_power_of_2(hidden), num_warps=MOE_PAIR_WARPS)
    total = torch.empty(n, hidden, device=x.device, dtype=x.dtype)
    pair_down_kernel[(n, triton.cdiv(hidden, MOE_PAIR_DOWN_BLOCK_N))](
        product, ids, down, weights.reshape(-1), total, hidden, width, product.stride(0), down.stride(0),
        down.stride(1), TOP_K=k, BLOCK_N=MOE_PAIR_DOWN_BLOCK_N, BLOCK_K=triton.next_power_of_2(width),
        num_warps=MOE_PAIR_DOWN_WARPS)
    return total


def moe(x, layer, logits=None):
    """A sparse layer's MLP over x [N, hidden]: route, then the grouped kernels. logits: the
    router's, where the caller made them (route's)."""
    weights, experts = route(x, layer, logits)
    if experts.numel() and x.stride(-1) == 1:
        return plus_shared_expert(grouped_experts(x, weights.contiguous(), experts.contiguous(), layer), x, layer)
    return plus_shared_expert(sorted_experts(x, weights, experts, layer), x, layer)
