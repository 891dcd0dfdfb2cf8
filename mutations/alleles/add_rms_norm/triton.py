"""Residual add and RMSNorm in one Triton kernel per row: one read of each input, two writes."""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

ADD_RMS_NORM_WARPS = 4  # range: 1..16; warps a program runs with (Triton's default: 4)


@triton.jit
def add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, num_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < num_cols
    offsets = row * num_cols + cols  # every tensor here is a contiguous [R, hidden]
    x = tl.load(x_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    # The sum is rounded to the compute dtype first, as `x + residual` in torch is.
    total = (x + r).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + offsets, total, mask=ok)
    t = total.to(tl.float32)
    scale = tl.rsqrt(tl.sum(t * t, axis=0) / num_cols + eps)
    normed = (t * scale).to(out_ptr.dtype.element_ty).to(tl.float32)  # cast back, then the weight
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(x, residual, weight, eps):
    """(rms_norm(x + residual), x + residual): the sum is the new residual stream."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()  # [R, hidden]
    res = residual.reshape(rows.shape).contiguous()
    out, total = torch.empty_like(rows), torch.empty_like(rows)
    add_rms_norm_kernel[(rows.shape[0],)](rows, res, weight, out, total, rows.shape[1], eps,
                                          BLOCK=triton.next_power_of_2(rows.shape[1]),
                                          num_warps=ADD_RMS_NORM_WARPS)
    return out.view(x.shape), total.view(x.shape)
