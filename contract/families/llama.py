"""Llama (Hugging Face model_type "llama"): Llama 3's rule for the RoPE frequencies
(rope_scaling, read from config.json's `rope_parameters` or `rope_scaling`)."""
from contract.families.feature import Feature

ORDER = 3
MODEL_TYPE = "llama"
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# The llama3 rule with a short original context, so that it changes most frequencies even
# on the gate's short traces (Llama 3's own 8192 would leave them untouched).
PROBE_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
FEATURE = Feature("rope_scaling", "llama3 RoPE scaling", off=None, probe=PROBE_LLAMA3)
TURNS_ON = {}  # its config.json says whether it scales
ROTATED = ()
REFERENCE = ("ReferenceModel.rope", "llama3_frequencies")  # fitness/reference.py
SEED_GENES = ("rope_frequencies",)  # seed_engine/engine.py


def attention_weights(config: dict, prefix: str) -> dict:
    """Its scaling changes frequencies, not weights."""
    return {}


def toy_weight(name: str, shape: tuple, std):
    """Its tensors are drawn as toy weights draw any (target/toy_weights.py)."""
    return None
