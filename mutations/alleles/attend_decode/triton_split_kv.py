"""Split-KV decode attention in Triton: each query reads only its request's live K/V.

K/V are found through the cache's block table, and the sequence is split so that short
batches still fill the GPU.

Phase one: a program per (request, query head, split) runs an online softmax in fp32 over
its share of the tokens and writes a partial (max, sum, weighted values). Phase two: a
program per (request, head) combines the splits. Any head_dim up to 256 (padded to a power
of two and masked), GQA by mapping query head h to K/V head h // groups. The grid depends
only on the batch and the cache's max_positions, so the call captures in a CUDA graph.
Works with any cache that exposes k/v as [pages, page_size, kv_heads, head_dim] per layer
and sets step.block_table (slab: one page per request; paged). A cache whose pages live in
chunks (paged_chunks) also has `chunk_offsets`, each chunk's distance in elements from the
one `k`/`v` view, and `chunk_pages`; any other cache is one chunk.
"""
import math

import torch
import triton
import triton.language as tl

REQUIRES = {"KVCache": ("paged_chunks", "paged", "slab")}  # in order of preference (see cuda_graphs_prefill)
DEVICES = "cuda"

DECODE_SPLIT_TOKENS = 256  # range: 64..2048; tokens per split (power of two)


@triton.jit
def split_kv_partial_kernel(q_ptr, k_ptr, v_ptr, table_ptr, offsets_ptr, positions_ptr, part_acc_ptr,
                            part_max_ptr, part_sum_ptr, stride_qb, stride_qh, stride_kp, stride_kr, stride_kh,
                            stride_tb, page_size, chunk_pages, split_tokens, sm_scale, num_heads, num_splits,
                            GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    length = tl.load(positions_ptr + b) + 1  # the new token is already in the cache
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + d, mask=d_ok, other=0.0).to(tl.float32)
    kv_head = h // GROUPS
    start = s * split_tokens
    end = tl.minimum(start + split_tokens, length)
    m_i = tl.zeros([1], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        page = tl.load(table_ptr + b * stride_tb + n // page_size, mask=n_ok, other=0).to(tl.int64)
        chunk_base = tl.load(offsets_ptr + page // chunk_pages, mask=n_ok, other=0)
        rows = chunk_base + (page % chunk_pages) * stride_kp + (n % page_size) * stride_kr \
            + kv_head * stride_kh  # [BLOCK_N]
        kv_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=kv_ok, other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], axis=1) * sm_scale  # [BLOCK_N], fp32 as the reference
        scores = tl.where(n_ok, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))  # [1]; finite: n0 < end
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)  # [BLOCK_N]
        v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=kv_ok, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    part = (b * num_heads + h) * num_splits + s  # an empty split leaves max -inf, sum 0
    tl.store(part_acc_ptr + part * BLOCK_D + d, acc)
    tl.store(part_max_ptr + part + tl.arange(0, 1), m_i)
    tl.store(part_sum_ptr + part + tl.arange(0, 1), l_i)


@triton.jit
def split_kv_combine_kernel(part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr, stride_ob, stride_oh,
                            num_heads, num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    part = (b * num_heads + h) * num_splits + s  # [BLOCK_S]
    m = tl.load(part_max_ptr + part, mask=s_ok, other=float("-inf"))
    l = tl.load(part_sum_ptr + part, mask=s_ok, other=0.0)
    m_all = tl.max(m, axis=0)  # finite: split 0 holds at least one token
    w = tl.exp(m - m_all)  # 0 for empty splits
    d = tl.arange(0, BLOCK_D)
    acc = tl.load(part_acc_ptr + part[:, None] * BLOCK_D + d[None, :], mask=s_ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def attend_decode(q, k, v, cache, layer, step):
    """Each request's one query over its live K/V only: q [B, heads, D] -> [B, heads*D]."""
    if q.dtype == torch.bfloat16:  # the kernel's fp32 probabilities miss a bf16 reference (see sdpa)
        return table_attention(q, cache, layer, step)
    batch, num_heads, head_dim = q.shape
    q = q.contiguous()
    k_pages, v_pages = cache.k[layer], cache.v[layer]  # [pages, page_size, kv_heads, D]
    table = step.block_table  # [B, width] page ids
    block_d = triton.next_power_of_2(head_dim)
    block_n = 32 if block_d <= 128 else 16  # keeps a [BLOCK_N, BLOCK_D] fp32 tile in registers
    num_splits = triton.cdiv(cache.max_positions, DECODE_SPLIT_TOKENS)  # static: graph-safe
    part_acc = torch.empty(batch, num_heads, num_splits, block_d, device=q.device, dtype=torch.float32)
    part_max = torch.empty(batch, num_heads, num_splits, device=q.device, dtype=torch.float32)
    part_sum = torch.empty_like(part_max)
    offsets, chunk_pages = chunk_table(cache, q.device)
    split_kv_partial_kernel[(batch, num_heads, num_splits)](
        q, k_pages, v_pages, table, offsets, step.positions, part_acc, part_max, part_sum,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        table.stride(0), cache.page_size, chunk_pages, DECODE_SPLIT_TOKENS, 1.0 / math.sqrt(head_dim),
        num_heads, num_splits, GROUPS=num_heads // k_pages.shape[2], HEAD_DIM=head_dim,
        BLOCK_D=block_d, BLOCK_N=block_n)
    out = torch.empty(batch, num_heads, head_dim, device=q.device, dtype=q.dtype)
    split_kv_combine_kernel[(batch, num_heads)](
        part_acc, part_max, part_sum, out, out.stride(0), out.stride(1), num_heads, num_splits,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(num_splits))
    return out.flatten(1)


ONE_CHUNK = {}  # device -> the offset table of a cache whose pages are all in one tensor


def chunk_table(cache, device):
    """(offsets, pages per chunk) of the cache's pages: a chunked pool's table, or one chunk."""
    if hasattr(cache, "chunk_offsets"):
        return cache.chunk_offsets, cache.chunk_pages
    if str(device) not in ONE_CHUNK:  # made once, outside any graph: its address stays put
        ONE_CHUNK[str(device)] = torch.zeros(1, dtype=torch.long, device=device)
    return ONE_CHUNK[str(device)], 2 ** 40
