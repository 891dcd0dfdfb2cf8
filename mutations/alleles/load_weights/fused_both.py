"""Fused q/k/v and fused gate/up weights: two matmuls per layer where the seed has five."""
REQUIRES = {"qkv_proj": ("fused",), "mlp": ("fused", "swiglu_triton", "glu_matmul")}
DEVICES = "any"


def load_weights(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype; per layer, "qkv" (with "qkv_sizes")
    and, in a dense layer, "gate_up" hold the stacked rows."""
    weights = read_checkpoint(model_config, weight_dir, device, dtype)
    for layer in weights["layers"]:
        if "q" in layer:  # a Gated DeltaNet layer (Qwen3.5) has no q, k, v
            stack_rows(layer, "qkv", ("q", "k", "v"))
        if "router" not in layer:  # a sparse layer's MLP is its experts: no dense gate/up
            stack_rows(layer, "gate_up", ("gate", "up"))
    return weights
