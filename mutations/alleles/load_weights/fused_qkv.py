"""q, k and v weights stored as one [q+k+v, hidden] matrix per layer, for one matmul."""
REQUIRES = {"qkv_proj": ("fused",)}
DEVICES = "any"


def load_weights(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype; per layer, "qkv" holds the q, k and
    v rows stacked and "qkv_sizes" their row counts."""
    weights = read_checkpoint(model_config, weight_dir, device, dtype)
    for layer in weights["layers"]:
        if "q" in layer:  # a Gated DeltaNet layer (Qwen3.5) has no q, k, v
            stack_rows(layer, "qkv", ("q", "k", "v"))
    return weights
