"""The norm before attention folded into the fused q/k/v projection at few rows: one launch, not two.

At one row (a batch-1 decode) the residual add and RMSNorm before a projection are a launch
of their own for a few KB of work, between two launches that move megabytes. Here each
program of the projection loads its columns of the weight and the norm's weight (no kernel
before it writes either), waits for the kernel before it under programmatic dependent launch
(PDL), then adds the residual, norms the whole row and multiplies (shared.norm_linear):
rounded as add_rms_norm.triton and the one-row prefetched linear round. More rows than
NORM_FOLD_ROWS (1 unless the search moves it), fp32, or a row wider than NORM_FOLD_WIDTH take
the genes apart.
"""
REQUIRES = {"qkv_proj": ("fused",)}
DEVICES = "cuda"


def norm_qkv(x, residual, weight, layer, eps):
    """(q, k, v, x + residual): q, k, v (biases added) of rms_norm(x + residual), and the sum,
    the new residual stream; the first layer passes residual None."""
    if not folds_norm(x, residual, layer["qkv"]):
        h, x = pre_norm(x, residual, weight, eps)
        return (*add_qkv_bias(*qkv_proj(h, layer), layer), x)
    qkv, x = norm_linear(x, residual, weight, layer["qkv"], eps)
    return (*add_qkv_bias(*qkv.split(layer["qkv_sizes"], dim=-1), layer), x)
