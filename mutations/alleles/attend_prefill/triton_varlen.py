"""Packed varlen causal attention in Triton: every prompt of the call in one launch, no padding.

A program per (prompt, query head, block of BLOCK_M queries) runs a flash-attention loop
over its prompt's keys up to the causal limit: scores and the online softmax in fp32,
probabilities cast to the compute dtype before @ v, as the reference casts them. In the
contract's bf16 (`cache.reference_rounding`) the reference rounds each probability after
dividing it by its row's sum, which unnormalised ones miss by 1.7-2.8x the tolerance: there
the kernel makes two passes over the keys, the row's max and sum first. Prompts
are addressed by start offset and length in the packed [N, heads, D] tensors; any head_dim
up to 256 (padded to a power of two, masked), GQA by query head h reading K/V head h // groups.
A call captured in a CUDA graph passes the starts and lengths as device buffers on the step
(`prompt_starts`, `prompt_lengths`: the cuda_graphs_prefill engine); the grid then covers
the whole call for every prompt slot, and blocks past a prompt's end do nothing.
Only key blocks that reach a block's diagonal or the prompt's end are masked; the ones
before it load and score unmasked: one layer of a 16 x 1024 prefill took 390 -> 328 us on
Llama-3.2-1B's heads and 368 -> 340 on Qwen3-0.6B's (H100, `prefill_attention_bench`,
docs/log/2026-11-27-batch-64-step-prefill-unmasked-blocks.md).
Blocks of 64 queries over 32 keys, two pipeline stages: on an H100 they took a layer of the
public prefill (4 x 128 tokens, head_dim 192) from 27.9 us with 16 x 16 blocks to 17.4, and a
1B-class group of 4 x 1024 prompts from 180 us to 97 (`python -m tools.probes.prefill_attention_bench`,
docs/log/2026-11-24-search-480ebbd-decode-kernel-costs.md): a block's keys are a sequential
loop, and 16 x 16 blocks made it long.
"""
import math

import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

PREFILL_BLOCK_M = 64  # range: 16..128; queries a program takes
PREFILL_BLOCK_N = 32  # range: 16..64; keys a step of its loop reads
PREFILL_WARPS = 4  # range: 1..16; warps a program runs with, twice as many for blocks over 64 queries
PREFILL_STAGES = 2  # range: 1..4, step 1; software-pipelining stages of its key loop


@triton.jit
def key_block(q, k_ptr, v_ptr, start, n0, rows, length, kv_head, stride_kt, stride_kh, stride_vt, stride_vh, d, d_ok,
              sm_scale, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """(fp32 scores of the block's queries against keys n0.. [BLOCK_M, BLOCK_N], those keys'
    values). MASKED: keys past the causal limit or the prompt score -inf and load as 0;
    without it every key is below every row's limit and in the prompt, and nothing is masked."""
    cols = n0 + tl.arange(0, BLOCK_N)
    token = (start + cols)[:, None].to(tl.int64)
    if MASKED:
        col_ok = cols < length
        kv_ok = col_ok[:, None] & d_ok[None, :]
    else:
        kv_ok = d_ok[None, :]
    k = tl.load(k_ptr + token * stride_kt + kv_head * stride_kh + d[None, :], mask=kv_ok, other=0.0)
    scores = tl.dot(q, tl.trans(k)).to(tl.float32) * sm_scale
    if MASKED:  # key 0 is in every block's first step and visible to every row: no row is all -inf
        scores = tl.where((cols[None, :] <= rows[:, None]) & col_ok[None, :], scores, float("-inf"))
    v = tl.load(v_ptr + token * stride_vt + kv_head * stride_vh + d[None, :], mask=kv_ok, other=0.0)
    return scores, v


@triton.jit
def online_softmax(scores, v, m_i, l_i, acc):
    """One key block into the running row max, row sum and output."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)  # p in the compute dtype


@triton.jit
def varlen_prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, starts_ptr, lengths_ptr, stride_qt, stride_qh,
                          stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, sm_scale,
                          GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NORMALIZE_FIRST: tl.constexpr):
    seq = tl.program_id(0)
    h = tl.program_id(1)
    first_row = (tl.num_programs(2) - 1 - tl.program_id(2)) * BLOCK_M  # the longest blocks first
    start = tl.load(starts_ptr + seq)
    length = tl.load(lengths_ptr + seq)
    rows = first_row + tl.arange(0, BLOCK_M)
    row_ok = rows < length
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    kv_head = h // GROUPS
    q = tl.load(q_ptr + (start + rows)[:, None].to(tl.int64) * stride_qt + h * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Keys up to the block's last query (causal); none for a block past the prompt (a captured
    # call's grid covers its whole bucket). Keys below `full` are seen by every row: unmasked.
    end = tl.where(first_row < length, tl.minimum(first_row + BLOCK_M, length), 0)
    full = (tl.minimum(first_row, end) // BLOCK_N) * BLOCK_N
    if NORMALIZE_FIRST:
        # The reference's rounding: softmax(scores).to(dtype) @ v, each probability rounded
        # after it is divided by its row's sum. So one pass for each row's max and sum, and a
        # second for the probabilities (the keys read twice).
        for n0 in range(0, end, BLOCK_N):
            scores, v = key_block(q, k_ptr, v_ptr, start, n0, rows, length, kv_head, stride_kt, stride_kh,
                                  stride_vt, stride_vh, d, d_ok, sm_scale, BLOCK_N, True)
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(scores - m_new[:, None]), axis=1)
            m_i = m_new
        for n0 in range(0, end, BLOCK_N):
            scores, v = key_block(q, k_ptr, v_ptr, start, n0, rows, length, kv_head, stride_kt, stride_kh,
                                  stride_vt, stride_vh, d, d_ok, sm_scale, BLOCK_N, True)
            p = tl.math.div_rn(tl.exp(scores - m_i[:, None]), l_i[:, None])  # IEEE-rounded, as torch divides
            acc += tl.dot(p.to(v.dtype), v)
        out = acc
    else:
        for n0 in range(0, full, BLOCK_N):
            scores, v = key_block(q, k_ptr, v_ptr, start, n0, rows, length, kv_head, stride_kt, stride_kh,
                                  stride_vt, stride_vh, d, d_ok, sm_scale, BLOCK_N, False)
            m_i, l_i, acc = online_softmax(scores, v, m_i, l_i, acc)
        for n0 in range(full, end, BLOCK_N):
            scores, v = key_block(q, k_ptr, v_ptr, start, n0, rows, length, kv_head, stride_kt, stride_kh,
                                  stride_vt, stride_vh, d, d_ok, sm_scale, BLOCK_N, True)
            m_i, l_i, acc = online_softmax(scores, v, m_i, l_i, acc)
        out = acc / l_i[:, None]
    tl.store(out_ptr + (start + rows)[:, None].to(tl.int64) * stride_ot + h * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def attend_prefill(q, k, v, cache, layer, step):
    """Causal attention over each prompt alone, packed: q [N, heads, D] -> [N, heads*D]."""
    num_tokens, num_heads, head_dim = q.shape
    # Rows may be strided (views of a fused projection, k rotated apart from v): only each
    # head's values must be adjacent (copying k and v to one layout cost two kernels a layer).
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs 16 or more
    starts, lengths = getattr(step, "prompt_starts", None), getattr(step, "prompt_lengths", None)
    if starts is None:  # host lists: one copy (and a wait for the device) a layer
        firsts = [0]
        for n in step.num_new[:-1]:
            firsts.append(firsts[-1] + n)
        starts, lengths = torch.tensor([firsts, step.num_new], device=q.device)
        longest = max(step.num_new)
        out = torch.empty_like(q)
    elif getattr(step, "longest_prompt", None):  # an eager call's starts and lengths, copied once
        longest = step.longest_prompt
        out = torch.empty_like(q)
    else:  # a captured call's static buffers: padded prompts of length 0, padding rows after them
        longest = num_tokens  # the grid cannot depend on the lengths
        out = torch.zeros_like(q)  # rows of no prompt stay finite: they write the scratch K/V row
    grid = (starts.shape[0], num_heads, triton.cdiv(longest, PREFILL_BLOCK_M))
    varlen_prefill_kernel[grid](
        q, k, v, out, starts, lengths,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        1.0 / math.sqrt(head_dim), GROUPS=num_heads // k.shape[1], HEAD_DIM=head_dim,
        BLOCK_M=PREFILL_BLOCK_M, BLOCK_N=PREFILL_BLOCK_N, BLOCK_D=block_d,
        NORMALIZE_FIRST=bool(cache.reference_rounding), num_stages=PREFILL_STAGES,
        num_warps=2 * PREFILL_WARPS if PREFILL_BLOCK_M > 64 else PREFILL_WARPS)
    return out.flatten(1)
