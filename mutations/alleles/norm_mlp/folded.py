"""The norm before the MLP, and SwiGLU after it, folded into its fused gate/up projection at few rows.

As norm_qkv.folded (shared.norm_linear), for the post-attention norm: each program loads its
columns of the gate weight, the same columns of the up weight and the norm's weight, waits
under PDL, then adds the residual (the o projection's output), norms the row, multiplies and
writes silu(gate) * up for its columns, rounded as mlp.swiglu_triton rounds it; the down
projection reads the product. The product in the projection's last step, not in the down
projection's programs (each of which recomputed the whole row's after its wait) or a launch
of its own: on an H100 Qwen3-0.6B's batch-1 step 0.752 -> 0.700 ms, Llama-3.2-1B's 1.010 ->
0.980 (docs/log/2026-11-27-swiglu-in-the-gate-up-projection.md).

A sparse layer has no gate/up to fold into: there the norm folds into the router's
projection, whose program 0 also writes the normed row the experts read, and moe takes the
logits (as route's), so the add and norm is no launch of its own. More rows than
NORM_FOLD_ROWS, fp32, or a row wider than NORM_FOLD_WIDTH take the genes apart.
"""
REQUIRES = {"load_weights": ("fused_gate_up", "fused_both")}
DEVICES = "cuda"


def norm_mlp(x, residual, weight, layer, eps):
    """(mlp(rms_norm(x + residual)), x + residual): the MLP's output (the experts' in a sparse
    layer, which has a router) and the new residual stream."""
    sparse = "router" in layer
    if not folds_norm(x, residual, layer["router"] if sparse else layer["gate_up"]):
        h, x = add_rms_norm(x, residual, weight, eps)
        return (moe(h, layer) if sparse else mlp(h, layer)), x
    if sparse:  # no gate/up to fold into: the router's projection, which writes the normed row too
        logits, x, h = norm_linear(x, residual, weight, layer["router"], eps, normed=True)
        return moe(h, layer, logits), x
    product, x = norm_linear(x, residual, weight, layer["gate_up"], eps, glu=True)
    return product @ layer["down"].T, x
