"""q and k made ready for attention, and k and v stored, in one Triton launch.

The seed's gene takes three launches a layer where the checkpoint has per-head norms
(Qwen3: norm_heads, RoPE, the K/V write) and two elsewhere; a batch-1 decode step is bound
by its launches (Qwen3-0.6B's 28 layers ran ~14 kernels each,
docs/log/2026-11-26-one-row-projections-in-triton.md). Here program
(t, 0) normalises token t's q heads (where the checkpoint has the norms), rotates them and
writes them back in place; program (t, 1) does the same to its k heads and writes them and
its v heads to the token's cache row. The rounding is that of norm_heads.triton and
apply_rope.triton_rows, whose helpers it calls (shared.norm_rows, shared.rotate_rows):
statistics in fp32, cast back before the weight, each RoPE product rounded to the compute
dtype.

The cache row is found as paged_chunks' own write kernel finds it (shared.slot_row: the
step's slot, its page, the page's chunk); another cache writes its rows itself after the
launch.
"""
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

ATTENTION_INPUTS_WARPS = 4  # range: 1..16; warps a program runs with (Triton's default: 4)


@triton.jit
def ready_heads(x_ptr, w_ptr, cos_ptr, sin_ptr, t, stride_t, stride_h, stride_ct, num_heads, eps,
                HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, NORM: tl.constexpr):
    """Token t's heads of x, each normed by w (NORM) and rotated, written over them and
    returned [BLOCK_H, 2 * BLOCK_P] in x's dtype."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, 2 * BLOCK_P)[None, :]
    ok = (heads < num_heads) & (cols < 2 * HALF)
    at = x_ptr + t * stride_t + heads * stride_h + cols
    x = tl.load(at, mask=ok, other=0.0).to(tl.float32)
    w = 0.0  # no norms: unread
    if NORM:
        w = tl.load(w_ptr + cols, mask=cols < 2 * HALF, other=0.0).to(tl.float32)
    c, s = rope_angles(cos_ptr, sin_ptr, t, stride_ct, HALF, BLOCK_P)
    out = ready_rows(x, w, c, s, 2 * HALF, eps, x_ptr.dtype.element_ty, BLOCK_H, BLOCK_P, NORM)
    tl.store(at, out, mask=ok)
    return out


@triton.jit
def attention_inputs_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, k_pool_ptr, v_pool_ptr,
                            slots_ptr, offsets_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                            stride_vh, stride_ct, stride_pool_page, stride_pool_row, chunk_shift, num_q_heads,
                            num_kv_heads, eps, HALF: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr,
                            BLOCK_P: tl.constexpr, NORM: tl.constexpr, WRITE: tl.constexpr,
                            PAGE_SIZE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        ready_heads(q_ptr, q_norm_ptr, cos_ptr, sin_ptr, t, stride_qt, stride_qh, stride_ct, num_q_heads, eps, HALF,
                    BLOCK_QH, BLOCK_P, NORM)
    else:
        k = ready_heads(k_ptr, k_norm_ptr, cos_ptr, sin_ptr, t, stride_kt, stride_kh, stride_ct, num_kv_heads, eps,
                        HALF, BLOCK_KH, BLOCK_P, NORM)
        if WRITE:
            row = slot_row(offsets_ptr, tl.load(slots_ptr + t), chunk_shift, stride_pool_page, stride_pool_row,
                           PAGE_SIZE)  # the slot's [kv_heads, head_dim] row
            heads = tl.arange(0, BLOCK_KH)[:, None]
            cols = tl.arange(0, 2 * BLOCK_P)[None, :]
            ok = (heads < num_kv_heads) & (cols < 2 * HALF)
            at = row + heads * (2 * HALF) + cols
            tl.store(k_pool_ptr + at, k, mask=ok)
            v = tl.load(v_ptr + t * stride_vt + heads * stride_vh + cols, mask=ok)
            tl.store(v_pool_ptr + at, v, mask=ok)


# allele: triton
def attention_inputs(q, k, v, layer, cos, sin, cache, step, index, eps):
    """q and k [N, heads, D] as attention reads them (each head normed where the checkpoint
    has the norms, then rotated), once k and v [N, kv_heads, D] are in the cache's layer
    `index`."""
    if q.shape[0] == 0:
        return q, k
    if 2 * cos.shape[-1] < q.shape[2]:  # RoPE on part of each head (Qwen3.5): the kernel turns all of it
        q, k = rotate_heads(*norm_heads(q, k, layer, eps), cos, sin)
        cache.write(index, step, k, v)
        return q, k
    # In place, as norm_heads.triton: every engine passes views of a fresh projection.
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    cos, sin = cos.contiguous(), sin.contiguous()
    norm = "q_norm" in layer
    write = hasattr(cache, "chunk_offsets")  # paged_chunks: its rows' addresses are known here
    k_pool, v_pool = (cache.k[index], cache.v[index]) if write else (k, v)  # [pages, page_size, kv_heads, D]
    slots, offsets = (step.slots, cache.chunk_offsets) if write else (q, q)
    half = q.shape[2] // 2
    attention_inputs_kernel[(q.shape[0], 2)](
        q, k, v, cos, sin, layer["q_norm"] if norm else q, layer["k_norm"] if norm else k, k_pool, v_pool, slots,
        offsets, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
        k_pool.stride(0), k_pool.stride(1), getattr(cache, "chunk_shift", 0), q.shape[1], k.shape[1], eps,
        HALF=half, BLOCK_QH=triton.next_power_of_2(q.shape[1]), BLOCK_KH=triton.next_power_of_2(k.shape[1]),
        BLOCK_P=triton.next_power_of_2(half), NORM=norm, WRITE=write, PAGE_SIZE=getattr(cache, "page_size", 1),
        num_warps=ATTENTION_INPUTS_WARPS)
    if not write:
        cache.write(index, step, k, v)
    return q, k
