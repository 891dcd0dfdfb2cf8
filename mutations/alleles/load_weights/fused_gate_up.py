"""gate and up weights stored as one [2*intermediate, hidden] matrix per layer, for one matmul."""
REQUIRES = {"mlp": ("fused", "swiglu_triton", "glu_matmul")}
DEVICES = "any"


def load_weights(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype; per dense layer, "gate_up" holds the
    gate rows then the up rows."""
    weights = read_checkpoint(model_config, weight_dir, device, dtype)
    for layer in weights["layers"]:
        if "router" not in layer:  # a sparse layer's MLP is its experts: no dense gate/up
            stack_rows(layer, "gate_up", ("gate", "up"))
    return weights
