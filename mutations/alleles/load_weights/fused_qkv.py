"""q, k and v weights stored as one [q+k+v, hidden] matrix per layer, for one matmul."""
import os

import torch

REQUIRES = {"qkv_proj": ("fused",)}
DEVICES = "any"


def load_weights(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype; per layer, "qkv" holds the q, k and
    v rows stacked and "qkv_sizes" their row counts."""
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
            "gate": get(p + "mlp.gate_proj.weight"),
            "up": get(p + "mlp.up_proj.weight"),
            "down": get(p + "mlp.down_proj.weight"),
        })
    return {"embed": get("embed_tokens.weight"), "layers": layers,
            "norm": get("norm.weight"), "lm_head": get("lm_head.weight")}
