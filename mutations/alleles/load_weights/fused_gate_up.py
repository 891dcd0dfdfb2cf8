"""gate and up weights stored as one [2*intermediate, hidden] matrix per layer, for one matmul."""
import os

import torch

REQUIRES = {"mlp": ("fused",)}
DEVICES = "any"


def load_weights(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype; per layer, "gate_up" holds the gate
    rows then the up rows."""
    raw = torch.load(os.path.join(weight_dir, "model.pt"), map_location="cpu", weights_only=True)

    def get(name):
        return raw[name].to(device=device, dtype=dtype)

    layers = []
    for i in range(model_config["num_hidden_layers"]):
        p = f"layers.{i}."
        layers.append({
            "input_norm": get(p + "input_layernorm.weight"),
            "q": get(p + "self_attn.q_proj.weight"),
            "k": get(p + "self_attn.k_proj.weight"),
            "v": get(p + "self_attn.v_proj.weight"),
            "o": get(p + "self_attn.o_proj.weight"),
            "post_norm": get(p + "post_attention_layernorm.weight"),
            "gate_up": torch.cat((raw[p + "mlp.gate_proj.weight"], raw[p + "mlp.up_proj.weight"]))
                            .to(device=device, dtype=dtype),  # [2*intermediate, hidden]
            "down": get(p + "mlp.down_proj.weight"),
        })
    return {"embed": get("embed_tokens.weight"), "layers": layers,
            "norm": get("norm.weight"), "lm_head": get("lm_head.weight")}
