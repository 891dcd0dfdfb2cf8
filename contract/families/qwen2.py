"""Qwen2 (Hugging Face model_type "qwen2"): biases on the q, k and v projections."""
from contract.families.feature import Feature

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
    q_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    return {prefix + "self_attn.q_proj.bias": (q_dim,), prefix + "self_attn.k_proj.bias": (kv_dim,),
            prefix + "self_attn.v_proj.bias": (kv_dim,)}
