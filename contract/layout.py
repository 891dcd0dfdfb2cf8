"""The weight layout: every tensor a config implies, by name and shape, and the name a
Hugging Face checkpoint stores it under.

The contract's names carry no `model.` prefix (`layers.0.self_attn.q_proj.weight`); a
Hugging Face checkpoint's do, except the head's (`lm_head.weight`). Its q/k rows are also
in another RoPE order: `ROTATED` names the tensors whose rows checkpoint.py permutes.
"""
import re

from contract.families import LAYOUTS, MIXER_FAMILIES, MLP_FAMILIES


def weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, in the contract's (generation) order."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    shapes = {"embed_tokens.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes.update(mixer_weights(config, p, i))
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes.update(mlp_weights(config, p, i))
    shapes["norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def mixer_weights(config: dict, prefix: str, layer: int) -> dict:
    """What mixes a layer's tokens: a family's own where it replaces attention (a Gated
    DeltaNet), else attention's q, k, v (and what the families add to them) and o."""
    for family in MIXER_FAMILIES:
        shapes = family.mixer_weights(config, prefix, layer)
        if shapes is not None:
            return shapes
    hidden, q_dim = config["hidden_size"], config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    shapes = {prefix + "self_attn.q_proj.weight": (q_rows(config), hidden),
              prefix + "self_attn.k_proj.weight": (kv_dim, hidden), prefix + "self_attn.v_proj.weight": (kv_dim, hidden)}
    for family in LAYOUTS:
        shapes.update(family.attention_weights(config, prefix))
    shapes[prefix + "self_attn.o_proj.weight"] = (hidden, q_dim)
    return shapes


def q_rows(config: dict) -> int:
    """q_proj's rows: each head's query, then, where attention's output is gated (Qwen3.5),
    that head's gate."""
    return config["num_attention_heads"] * config["head_dim"] * (2 if config.get("attn_output_gate") else 1)


def mlp_weights(config: dict, prefix: str, layer: int) -> dict:
    """A layer's MLP tensors: a family's own where it replaces the dense SwiGLU (experts), else those."""
    for family in MLP_FAMILIES:
        shapes = family.mlp_weights(config, prefix, layer)
        if shapes is not None:
            return shapes
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    return {prefix + "mlp.gate_proj.weight": (inter, hidden), prefix + "mlp.up_proj.weight": (inter, hidden),
            prefix + "mlp.down_proj.weight": (hidden, inter)}


def hf_name(name: str) -> str:
    """The contract's tensor name as a Hugging Face checkpoint stores it."""
    return name if name == "lm_head.weight" else "model." + name


def contract_name(stored: str) -> str:
    """A Hugging Face checkpoint's tensor name in the contract's names."""
    return stored.removeprefix("model.")


# Tensors whose rows are laid out per head for RoPE: permuted from rotate-half order.
ROTATED = re.compile(r"self_attn\.(%s)\." % "|".join(name for family in LAYOUTS for name in family.ROTATED))
