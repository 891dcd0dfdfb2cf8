"""RoPE in one Triton kernel: a program per token rotates every head's interleaved pairs.

The seed's rotation is about eight kernels (two strided slices, four products, a sum, a
difference, a stack); on a decode step each is a launch of almost no work, twice a layer
(q and k). Here it is one launch each, reading x through its strides (a slice of a fused
QKV projection needs no copy first). Each product is rounded to the compute dtype before
the sum, as the reference's elementwise ops round (shared.rotate_pair): through mul_rn, or
ptxas fuses the unrounded product into the 16-bit add and 1 in 5 bf16 outputs differed
from torch's (H100, docs/log/2026-11-27-weights-into-l2-ahead.md,
2026-11-28-bf16-rope-through-kernels-exact.md).
"""
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ct, stride_ot, stride_oh,
                num_heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr):
    t = tl.program_id(0)
    heads = tl.arange(0, BLOCK_H)[:, None]
    pairs = tl.arange(0, BLOCK_P)[None, :]
    ok = (heads < num_heads) & (pairs < HALF)
    src = x_ptr + t.to(tl.int64) * stride_xt + heads * stride_xh + 2 * pairs
    x0 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x1 = tl.load(src + 1, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + t.to(tl.int64) * stride_ct + pairs, mask=pairs < HALF, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t.to(tl.int64) * stride_ct + pairs, mask=pairs < HALF, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    first, second = rotate_pair(x0, x1, c, s, dtype)
    dst = out_ptr + t.to(tl.int64) * stride_ot + heads * stride_oh + 2 * pairs
    tl.store(dst, first.to(dtype), mask=ok)
    tl.store(dst + 1, second.to(dtype), mask=ok)


def apply_rope(x, cos, sin):
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x [N, heads, head_dim]."""
    return launch_rope(rope_kernel, x, cos, sin)
