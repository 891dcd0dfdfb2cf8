"""The norm before the MLP folded into its fused gate/up projection at one row: one launch, not two.

As norm_qkv.folded (shared.norm_linear), for the post-attention norm: each program loads its
columns of the gate/up weight and the norm's weight, waits under PDL, then adds the residual
(the o projection's output), norms the row and multiplies; mlp.swiglu_triton's kernels
(shared.swiglu) take it from there, whichever mlp the program carries. More rows, fp32, or
a row wider than NORM_FOLD_WIDTH take the genes apart.
"""
REQUIRES = {"load_weights": ("fused_gate_up", "fused_both")}
DEVICES = "cuda"


def norm_mlp(x, residual, weight, layer, eps):
    """(mlp(rms_norm(x + residual)), x + residual): the MLP's output and the new residual stream."""
    if not folds_norm(x, residual, layer["gate_up"]):
        h, x = add_rms_norm(x, residual, weight, eps)
        return mlp(h, layer), x
    gate_up, x = norm_linear(x, residual, weight, layer["gate_up"], eps)
    return swiglu(gate_up, layer), x
