"""RMSNorm over each head of q and k in one Triton launch, in place through their strides.

q and k are views of the fused QKV projection's output. The seed's two `rms_norm` calls
under `rms_norm.triton` cost a copy (`.contiguous()`) and a norm each: four launches a layer,
and a launch-bound decode step (Qwen3-0.6B's batch 1) pays for each. Here program (t, 0)
normalises token t's q heads and (t, 1) its k heads, reading and writing them where they
are: q and k stay adjacent in the fused output, so a graph engine still rotates both in one
RoPE launch (`adjacent_heads`). Statistics in fp32, cast back before the weight multiply:
`rms_norm.triton`'s rounding.
"""
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

NORM_HEADS_WARPS = 4  # range: 1..16; warps a program runs with (Triton's default: 4)


@triton.jit
def norm_head_rows(x_ptr, w_ptr, t, stride_t, stride_h, num_heads, head_dim, eps, BLOCK_H: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """RMSNorm of each of token t's heads of x, written over them."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    ok = (heads < num_heads) & (cols < head_dim)
    at = x_ptr + t * stride_t + heads * stride_h + cols  # [BLOCK_H, BLOCK_D]
    x = tl.load(at, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < head_dim, other=0.0).to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    tl.store(at, norm_rows(x, w, head_dim, eps, dtype).to(dtype), mask=ok)


@triton.jit
def norm_heads_kernel(q_ptr, k_ptr, q_norm_ptr, k_norm_ptr, stride_qt, stride_qh, stride_kt, stride_kh,
                      num_q_heads, num_k_heads, head_dim, eps, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr,
                      BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        norm_head_rows(q_ptr, q_norm_ptr, t, stride_qt, stride_qh, num_q_heads, head_dim, eps, BLOCK_QH, BLOCK_D)
    else:
        norm_head_rows(k_ptr, k_norm_ptr, t, stride_kt, stride_kh, num_k_heads, head_dim, eps, BLOCK_KH, BLOCK_D)


def norm_heads(q, k, layer, eps):
    """RMSNorm over each head of q [N, heads, D] and k [N, kv_heads, D], where the
    checkpoint has the norms (Qwen3: before RoPE)."""
    if "q_norm" not in layer or q.shape[0] == 0:
        return q, k
    q, k = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k))  # the kernel steps 1 along a head
    # In place: every engine passes views of a fresh projection (no cache or graph input), then reads only the result
    norm_heads_kernel[(q.shape[0], 2)](q, k, layer["q_norm"], layer["k_norm"], q.stride(0), q.stride(1), k.stride(0),
                                       k.stride(1), q.shape[1], k.shape[1], q.shape[2], eps,
                                       BLOCK_QH=triton.next_power_of_2(q.shape[1]),
                                       BLOCK_KH=triton.next_power_of_2(k.shape[1]),
                                       BLOCK_D=triton.next_power_of_2(q.shape[2]), num_warps=NORM_HEADS_WARPS)
    return q, k
