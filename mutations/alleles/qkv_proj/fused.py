"""q, k, v from one matmul by the stacked weight, split by columns."""
REQUIRES = {"load_weights": ("fused_qkv", "fused_both")}
DEVICES = "any"


def qkv_proj(x, layer):
    """q [N, heads*head_dim], k and v [N, kv_heads*head_dim] from x [N, hidden]."""
    # One launch and one read of x instead of three; the splits are views, no copies.
    return (x @ layer["qkv"].T).split(layer["qkv_sizes"], dim=-1)
