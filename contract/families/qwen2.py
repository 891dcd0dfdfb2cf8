"""Qwen2 (Hugging Face model_type "qwen2"): biases on the q, k and v projections."""
import torch

from contract.families.feature import Feature

ORDER = 1
MODEL_TYPE = "qwen2"
FEATURE = Feature("qkv_bias", "the q/k/v biases", off=False, probe=True)
TURNS_ON = {"qkv_bias": True}  # what its config.json implies without saying
ROTATED = ()  # its biases are q_proj's and k_proj's, rotated as theirs (dense.ROTATED)
REFERENCE = ("ReferenceModel.linear",)  # fitness/reference.py
SEED_GENES = ("add_qkv_bias",)  # seed_engine/engine.py


def attention_weights(config: dict, prefix: str) -> dict:
    """The biases, after v_proj's weight (the order toy weights are drawn in)."""
    if not config.get("qkv_bias"):
        return {}
    from contract.layout import q_rows  # (a gated attention's q_proj has gate rows too)

    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    return {prefix + "self_attn.q_proj.bias": (q_rows(config),), prefix + "self_attn.k_proj.bias": (kv_dim,),
            prefix + "self_attn.v_proj.bias": (kv_dim,)}


def toy_weight(name: str, shape: tuple, std):
    """A bias drawn at the matrices' scale (1 for "unit"), so that one read in another's place
    shows; None for a tensor not its own."""
    if not name.endswith("proj.bias"):
        return None
    return torch.randn(shape) * (1.0 if std == "unit" else float(std))
