"""A small decode's attention inputs readied inside the split-KV attention: one launch fewer a layer.

attention_inputs.triton readies q and k (head norms, RoPE) and stores k and v in one launch,
which the split-KV kernels then wait for: at batch 1 a boundary with a few KB of work on
either side. On an H100, leaving that launch out of the recipe's Qwen3-0.6B batch-1 step
(a timing-only variant) took it from 0.80 to 0.74 ms
(docs/log/2026-11-27-qwen3-batch-1-step-by-leaving-parts-out.md).
Here each split-KV program readies its own q heads after its wait, and the split holding
the newest token readies that token's k and stores it and v where attention_inputs would
(the cache row the block table gives the position), then reads both from its registers.
The rounding is attention_inputs.triton's, through the same helpers (shared.norm_rows,
shared.rotate_by). Prefills, larger batches (READY_BATCH; above head_dim 128, any past
DECODE_PREFETCH_BATCH), the contract's bf16 (its two-pass softmax) and RoPE on part of
each head (Qwen3.5: the readying turns all of it) keep the two genes apart.
"""

REQUIRES = {"attend_decode": ("triton_split_kv",)}
DEVICES = "cuda"

READY_BATCH = 1  # range: 0..256; the largest decode batch whose split-KV programs ready q and k themselves
# Above head_dim 128 the readying kernel compiles only with its first tile loaded before its
# wait (batches up to DECODE_PREFETCH_BATCH): without it Triton 3.6's layout pass fails on
# sm_90 (the GPU machine's Triton; 3.9 compiles it), and a search that raised READY_BATCH
# alone judged a crash (H100, docs/log/2026-11-27-weights-into-l2-ahead.md).
READY_WIDE_HEAD = 128


# allele: split_kv
def attention(q, k, v, layer, cos, sin, cache, step, index, eps):
    """A layer's attention [N, heads*D] of q [N, heads, D], k and v [N, kv_heads, D] as
    projected: attention_inputs readies q and k and stores k and v, then the step's attend
    reads the cache."""
    if (not step.is_decode or q.shape[0] > READY_BATCH or cache.reference_rounding
            or (q.shape[-1] > READY_WIDE_HEAD and q.shape[0] > DECODE_PREFETCH_BATCH)
            or 2 * cos.shape[-1] < q.shape[-1]):  # RoPE on part of each head (Qwen3.5): the kernel turns all of it
        q, k = attention_inputs(q, k, v, layer, cos, sin, cache, step, index, eps)
        attend = attend_decode if step.is_decode else attend_prefill
        return attend(q, k, v, cache, index, step)
    ready = (k, v, layer.get("q_norm"), layer.get("k_norm"), cos.contiguous(), sin.contiguous(), eps)
    return split_kv_attention(q, cache, index, step, ready)
