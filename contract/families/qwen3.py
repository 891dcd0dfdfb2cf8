"""Qwen3 (Hugging Face model_type "qwen3"): an RMSNorm over each head of q and k, before RoPE."""
import torch

from contract.families.feature import Feature

ORDER = 2
MODEL_TYPE = "qwen3"
FEATURE = Feature("qk_norm", "the q/k norms", off=False, probe=True)
TURNS_ON = {"qk_norm": True}  # what its config.json implies without saying
ROTATED = ("q_norm", "k_norm")  # a norm weight per head dimension, in q's and k's RoPE order
REFERENCE = ("ReferenceModel.attention",)  # fitness/reference.py
SEED_GENES = ("norm_heads",)  # seed_engine/engine.py


def attention_weights(config: dict, prefix: str) -> dict:
    """The two norm weights of head_dim, after q, k, v and their biases."""
    if not config.get("qk_norm"):
        return {}
    return {prefix + "self_attn.q_norm.weight": (config["head_dim"],),
            prefix + "self_attn.k_norm.weight": (config["head_dim"],)}


def toy_weight(name: str, shape: tuple, std):
    """A norm weight drawn around 1 (1 + N(0, 1/4)), so that one read in the wrong order
    shows; None for a tensor not its own."""
    if not name.endswith(("q_norm.weight", "k_norm.weight")):
        return None
    return 1 + torch.randn(shape) / 2
