"""The delta rule's per-chunk systems (Qwen3.5's prefill) in one Triton kernel: a program per head and chunk.

The seed builds them in torch over all chunks at once: the decay's cumsum, the [C, C]
decay ratios, two products, and two triangular solves of (I + A) (cuBLAS's batch_trsm:
1.9 ms a solve for 16,384 tokens on an H200), each a pass over [heads, chunks, C, C] or
[heads, chunks, C, D] fp32 tensors (docs/log/2026-11-29-hybrid-chunk-systems-in-triton.md).
Here a program keeps its chunk in registers: G = cumsum(g), A and the causal attention from
two products, (I + A)^-1 by forward substitution a row at a time (A is strictly lower, so
row i of the inverse is e_i minus A's row i times the rows above it), then u and w as
products with the inverse. fp32 as the seed (its inputs are fp32 in every engine); the
products are "tf32x3", three tf32 products on the tensor cores with about fp32's accuracy,
where plain tf32 would round the inverse's entries, which can be far from 1, to 10 bits.

The substitution is the kernel's serial part: 64 rounds, each needing row i of A across the
tile. Taken from the registers, the row is a reduction across warps (shared memory and a
barrier a round); with SYSTEM_ROWS_FROM_MEMORY, A goes to a scratch tensor once and each
round loads its row, laid out as the product needs it. On an H200, 16 prompts of 1,024 a
layer: 2.63 ms from the registers, 3.51 from memory (4 warps;
docs/log/2026-11-29-moe-search-from-seed-hybrid-one-gpu-sweep.md), so the knob stays 0.
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

# 4 warps: 2.63 ms a call on 16 x 1,024 tokens of Qwen3.5's width against 4.16 with 8 (an H200,
# tools.probes.chunk_systems_cost), and served at 64 at once 1.02x
# (docs/log/2026-11-29-moe-search-from-seed-hybrid-one-gpu-sweep.md).
SYSTEM_WARPS = 4  # range: 4..16; warps a chunk's program runs with ([C, D] fp32 tiles in registers)
SYSTEM_ROWS_FROM_MEMORY = 0  # range: 0..1, step 1; 1: the substitution's rows of A loaded from a scratch


@triton.jit
def chunk_systems_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, u_ptr, w_ptr, decay_ptr, attention_ptr, a_ptr,
                         KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, CHUNK: tl.constexpr,
                         BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, PRECISION: tl.constexpr,
                         ROWS_FROM_MEMORY: tl.constexpr):
    """One chunk of one head: q, k, w [CHUNK, KEY_DIM], v, u [CHUNK, VALUE_DIM], g, beta, decay
    [CHUNK], attention and the scratch a [CHUNK, CHUNK], each at the chunk's offset (program_id)
    in its tensor."""
    chunk = tl.program_id(0)
    t = tl.arange(0, CHUNK)
    dk, dv = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_V)
    k_ok, v_ok = (dk < KEY_DIM)[None, :], (dv < VALUE_DIM)[None, :]
    decay = tl.cumsum(tl.load(g_ptr + chunk * CHUNK + t), 0)
    beta = tl.load(beta_ptr + chunk * CHUNK + t)
    tl.store(decay_ptr + chunk * CHUNK + t, decay)
    # exp(G_i - G_j) on and below the diagonal; above it the difference may overflow: not taken
    between = tl.where(t[:, None] >= t[None, :], tl.exp(decay[:, None] - decay[None, :]), 0.0)
    keys = chunk * CHUNK * KEY_DIM + t[:, None] * KEY_DIM + dk[None, :]
    k = tl.load(k_ptr + keys, mask=k_ok, other=0.0)
    q = tl.load(q_ptr + keys, mask=k_ok, other=0.0)
    attention = tl.dot(q, tl.trans(k), input_precision=PRECISION) * between
    tl.store(attention_ptr + chunk * CHUNK * CHUNK + t[:, None] * CHUNK + t[None, :], attention)
    k_beta = k * beta[:, None]
    a = tl.where(t[:, None] > t[None, :], tl.dot(k_beta, tl.trans(k), input_precision=PRECISION) * between, 0.0)
    squares = chunk * CHUNK * CHUNK
    if ROWS_FROM_MEMORY:
        tl.store(a_ptr + squares + t[:, None] * CHUNK + t[None, :], a)
        tl.debug_barrier()  # the program's own stores seen by all its threads before the loads
    # The inverse, kept transposed (column i is its row i): columns past i are still zero
    inverse_t = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    for i in range(CHUNK):
        if ROWS_FROM_MEMORY:
            a_row = tl.load(a_ptr + squares + i * CHUNK + t)  # A[i, :]
        else:
            a_row = tl.sum(tl.where(t[:, None] == i, a, 0.0), 0)
        column = tl.where(t == i, 1.0, 0.0) - tl.sum(inverse_t * a_row[None, :], 1)
        inverse_t = tl.where(t[None, :] == i, column[:, None], inverse_t)
    inverse = tl.trans(inverse_t)
    w = tl.dot(inverse, k_beta * tl.exp(decay)[:, None], input_precision=PRECISION)
    tl.store(w_ptr + keys, w, mask=k_ok)
    values = chunk * CHUNK * VALUE_DIM + t[:, None] * VALUE_DIM + dv[None, :]
    v = tl.load(v_ptr + values, mask=v_ok, other=0.0)
    u = tl.dot(inverse, v * beta[:, None], input_precision=PRECISION)
    tl.store(u_ptr + values, u, mask=v_ok)


def chunk_systems(q, k, v, log_decay, beta):
    """The seed's (u, w, G, attention) for q, k [H, chunks, C, Dk], v [H, chunks, C, Dv],
    log_decay and beta [H, chunks, C], fp32."""
    heads, chunks, size, key_dim = q.shape
    value_dim = v.shape[-1]
    q, k, v, log_decay, beta = (t.contiguous() for t in (q, k, v, log_decay, beta))
    u, w = torch.empty_like(v), torch.empty_like(k)
    decay = torch.empty_like(log_decay)
    attention = q.new_empty(heads, chunks, size, size)
    a = torch.empty_like(attention) if SYSTEM_ROWS_FROM_MEMORY else attention  # unread when 0
    if heads * chunks:
        chunk_systems_kernel[(heads * chunks,)](
            q, k, v, log_decay, beta, u, w, decay, attention, a, KEY_DIM=key_dim, VALUE_DIM=value_dim, CHUNK=size,
            BLOCK_K=max(16, triton.next_power_of_2(key_dim)), BLOCK_V=max(16, triton.next_power_of_2(value_dim)),
            PRECISION="tf32x3", ROWS_FROM_MEMORY=SYSTEM_ROWS_FROM_MEMORY, num_warps=SYSTEM_WARPS)
    return u, w, decay, attention
