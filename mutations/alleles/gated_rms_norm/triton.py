"""A Gated DeltaNet's output norm and gate (Qwen3.5) in one Triton kernel.

The seed casts the delta rule's fp32 output to the compute dtype, RMS-normalises each head
(its rms_norm: six launches), scales, and multiplies by silu(z) (three more). Here a program
per token and head reads both rows once and writes the product, rounding where the seed's
ops round: the output to z's dtype, the normalised row, its product with the weight, the
product with silu(z).
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

GATED_NORM_WARPS = 1  # range: 1..8; a program's row is value dim (128) numbers


@triton.jit
def gated_rms_norm_kernel(out_ptr, z_ptr, weight_ptr, result_ptr, width, eps, BLOCK: tl.constexpr):
    """result[row] = rms_norm(out[row]) * weight * silu(z[row]), a row a head's value dim."""
    row = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    ok = d < width
    dtype = z_ptr.dtype.element_ty
    x = tl.load(out_ptr + row * width + d, mask=ok, other=0.0).to(dtype).to(tl.float32)
    normed = (x * tl.rsqrt(tl.sum(x * x, 0) / width + eps)).to(dtype).to(tl.float32)
    normed = (normed * tl.load(weight_ptr + d, mask=ok, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    z = tl.load(z_ptr + row * width + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(result_ptr + row * width + d, (normed * z * tl.sigmoid(z)).to(dtype), mask=ok)


def gated_rms_norm(out, z, weight, eps):
    """The seed's: [N, heads * value dim] in z's dtype."""
    rows, heads, width = out.shape
    result = torch.empty(rows, heads * width, device=z.device, dtype=z.dtype)
    if rows:
        gated_rms_norm_kernel[(rows * heads,)](out.contiguous(), z.contiguous(), weight, result, width, eps,
                                               BLOCK=triton.next_power_of_2(width), num_warps=GATED_NORM_WARPS)
    return result
