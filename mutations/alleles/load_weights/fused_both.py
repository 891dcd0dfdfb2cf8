"""Fused q/k/v and fused gate/up weights: two matmuls per layer where the seed has five."""
import os

import torch

REQUIRES = {"qkv_proj": ("fused",), "mlp": ("fused",)}
DEVICES = "any"


def load_weights(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype; per layer, "qkv" (with "qkv_sizes")
    and "gate_up" hold the stacked rows."""
    raw = torch.load(os.path.join(weight_dir, "model.pt"), map_location="cpu", weights_only=True)

    def get(name):
        return raw[name].to(device=device, dtype=dtype)

    layers = []
    for i in range(model_config["num_hidden_layers"]):
        p = f"layers.{i}."
        q, k, v = (raw[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        layers.append({
            "input_norm": get(p + "input_layernorm.weight"),
            "qkv": torch.cat((q, k, v)).to(device=device, dtype=dtype),  # [q+k+v rows, hidden]
            "qkv_sizes": (q.shape[0], k.shape[0], v.shape[0]),
            "o": get(p + "self_attn.o_proj.weight"),
            "post_norm": get(p + "post_attention_layernorm.weight"),
            "gate_up": torch.cat((raw[p + "mlp.gate_proj.weight"], raw[p + "mlp.up_proj.weight"]))
                            .to(device=device, dtype=dtype),  # [2*intermediate, hidden]
            "down": get(p + "mlp.down_proj.weight"),
        })
    return {"embed": get("embed_tokens.weight"), "layers": layers,
            "norm": get("norm.weight"), "lm_head": get("lm_head.weight")}
