"""RoPE in one Triton kernel that reads and writes each head's row whole.

`apply_rope.triton` loads the even and the odd elements of a row as two strided loads and
stores them the same way: on an H100 it moved 0.42 TB/s on a 1B-class prefill (316 us a
call for 16 x 1024 tokens, 16% of the case's GPU time) and took 8 us a call on a batch of
64 decodes (docs/log/2026-11-23-gqa-split-kv-decode-kernel.md). Here a program loads its
token's [heads, head_dim] tile in one contiguous load, splits it into the pairs in
registers, and joins the rotated pairs back before one contiguous store
(shared.rotate_rows). Each product is rounded to the compute dtype before the sum, as the
reference's elementwise ops round (see `apply_rope.triton`).
"""
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"


@triton.jit
def rope_rows_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ct, stride_ot, stride_oh,
                     num_heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, 2 * BLOCK_P)[None, :]
    ok = (heads < num_heads) & (cols < 2 * HALF)
    x = tl.load(x_ptr + t * stride_xt + heads * stride_xh + cols, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = rotate_rows(x, cos_ptr, sin_ptr, t, stride_ct, dtype, HALF, BLOCK_H, BLOCK_P)
    tl.store(out_ptr + t * stride_ot + heads * stride_oh + cols, out.to(dtype), mask=ok)


def apply_rope(x, cos, sin):
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x [N, heads, head_dim]."""
    return launch_rope(rope_rows_kernel, x, cos, sin)
