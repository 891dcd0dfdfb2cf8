"""The contract's own model (model_config.json's "tiny_llama"): a dense decoder of RMSNorm,
attention with RoPE and a SwiGLU MLP, which every other family here extends. Its one feature
is the tied head: the output head is the embedding table (tie_word_embeddings)."""
from contract.families.feature import Feature

ORDER = 0
FEATURE = Feature("tie_word_embeddings", "the tied head", off=False, probe=True)
TURNS_ON = {}
ROTATED = ("q_proj", "k_proj")  # tensors whose rows a checkpoint lays out per head for RoPE
REFERENCE = ("ReferenceModel.rms_norm", "ReferenceModel.rope", "ReferenceModel.attention",
             "ReferenceModel.mlp", "ReferenceModel.forward")  # fitness/reference.py
SEED_GENES = ("read_config", "read_tensors", "read_checkpoint", "load_weights", "rms_norm", "rope_tables",
              "apply_rope", "qkv_proj", "mlp", "norm_mlp", "attend_prefill", "attend_decode")  # seed_engine/engine.py


def attention_weights(config: dict, prefix: str) -> dict:
    """The dense attention adds nothing past q, k and v (layout.weight_shapes writes those)."""
    return {}


def toy_weight(name: str, shape: tuple, std):
    """Its tensors are drawn as toy weights draw any (target/toy_weights.py)."""
    return None
