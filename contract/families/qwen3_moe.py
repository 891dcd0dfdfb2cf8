"""Qwen3-MoE (Hugging Face model_type "qwen3_moe"): Qwen3's attention (q/k norms) and, in its
sparse layers, a mixture-of-experts MLP in place of the dense one: a router (`mlp.gate`,
[num_experts, hidden]) picks num_experts_per_tok experts per token, each a SwiGLU of
moe_intermediate_size, their outputs summed by the router's (renormalised) probabilities.

Structural, not probed: the gate's `families` config turns every other family's feature on
for a dense target, since any checkpoint may bring them; an MoE MLP changes what a layer is
and which tensors it has, so it is judged on MoE targets only (their derived configs keep it).
"""
import torch

from contract.families.feature import Feature

ORDER = 4
MODEL_TYPE = "qwen3_moe"
FEATURE = Feature("num_experts", "the mixture-of-experts MLP", off=0, probe=None, is_structural=True)
TURNS_ON = {"qk_norm": True}  # Qwen3's attention
ROTATED = ()
REFERENCE = ("ReferenceModel.moe", "ReferenceModel.route")  # fitness/reference.py
SEED_GENES = ("route", "dispatch", "experts_swiglu", "combine", "sorted_experts", "moe")  # seed_engine/engine.py
# config.json's spellings of its keys -> ModelConfig's (transformers 5.24 writes num_local_experts)
HF_KEYS = {"num_experts": ("num_experts", "num_local_experts"), "num_experts_per_tok": ("num_experts_per_tok",),
           "norm_topk_prob": ("norm_topk_prob",), "moe_intermediate_size": ("moe_intermediate_size",),
           "decoder_sparse_step": ("decoder_sparse_step",), "mlp_only_layers": ("mlp_only_layers",)}


def hf_fields(raw: dict) -> dict:
    """Its config.json's MoE keys under ModelConfig's names (those it leaves out keep their defaults)."""
    fields = {}
    for field, spellings in HF_KEYS.items():
        found = [raw[key] for key in spellings if raw.get(key) is not None]
        if found:
            fields[field] = found[0]
    return fields


def is_sparse_layer(config: dict, layer: int) -> bool:
    """Whether layer `layer` has experts (transformers' Qwen3MoeDecoderLayer's rule)."""
    return (layer not in (config.get("mlp_only_layers") or ()) and (config.get("num_experts") or 0) > 0
            and (layer + 1) % (config.get("decoder_sparse_step") or 1) == 0)


def attention_weights(config: dict, prefix: str) -> dict:
    """Its attention's q/k norms are Qwen3's (qwen3.attention_weights writes them)."""
    return {}


def mlp_weights(config: dict, prefix: str, layer: int) -> dict | None:
    """A sparse layer's router and experts (and a shared expert with its gate, where the config
    has one), in save_pretrained's names; None for a dense layer."""
    if not is_sparse_layer(config, layer):
        return None
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    shapes = {prefix + "mlp.gate.weight": (config["num_experts"], hidden)}
    for e in range(config["num_experts"]):
        p = f"{prefix}mlp.experts.{e}."
        shapes.update({p + "gate_proj.weight": (inter, hidden), p + "up_proj.weight": (inter, hidden),
                       p + "down_proj.weight": (hidden, inter)})
    shared = config.get("shared_expert_intermediate_size") or 0
    if shared:  # beside the routed experts, for every token (Qwen3.5)
        p = prefix + "mlp.shared_expert."
        shapes.update({p + "gate_proj.weight": (shared, hidden), p + "up_proj.weight": (shared, hidden),
                       p + "down_proj.weight": (hidden, shared), prefix + "mlp.shared_expert_gate.weight": (1, hidden)})
    return shapes


def toy_weight(name: str, shape: tuple, std):
    """Its tensors are drawn as toy weights draw any (target/toy_weights.py)."""
    return None


ROUTING_DIMS = 8  # residual dimensions that carry a token's routing code in toy weights


def settle_toy_weights(config: dict, weights: dict, seed: int) -> None:
    """Toy weights that route decisively, so the gate can hold an engine's routing exact in
    bf16 too (fitness/reference_logits.py: on random routers bf16 rounding alone picks other
    experts at most positions). The first ROUTING_DIMS dimensions of the residual stream hold
    a one-hot code per token (its embedding); no layer writes them (those rows of o_proj and
    of every down projection are zero), so they stay as embedded. A router reads only them:
    code j ranks the experts by column j, whose top k values lie in [0.5, 1] and the rest in
    [-1, 0]. The RMS norm scales a position's logits alike, so its top k are those of its
    code, half the logit range clear of the (k+1)-th at every layer and position. (A Gated
    DeltaNet's out_proj, Qwen3.5's, writes the stream as o_proj does.)"""
    if not config.get("num_experts"):
        return
    hidden, experts, k = config["hidden_size"], config["num_experts"], config["num_experts_per_tok"]
    dims, generator = min(ROUTING_DIMS, hidden // 4), torch.Generator().manual_seed(seed)
    embed = weights["embed_tokens.weight"]
    size = 3 * embed[:, dims:].std()
    embed[:, :dims] = 0
    embed[torch.arange(embed.shape[0]), torch.randint(0, dims, (embed.shape[0],), generator=generator)] = size
    levels = torch.cat((torch.linspace(1.0, 0.5, k), torch.linspace(0.0, -1.0, experts - k)))
    for layer in range(config["num_hidden_layers"]):
        p = f"layers.{layer}."
        for name in [n for n in weights if n.startswith(p) and n.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight"))]:
            weights[name][:dims] = 0
        weights[p + "post_attention_layernorm.weight"][:dims] = weights[p + "post_attention_layernorm.weight"][:dims].abs()
        if p + "mlp.gate.weight" in weights:
            router = torch.zeros(experts, hidden)
            for j in range(dims):
                router[torch.randperm(experts, generator=generator), j] = levels
            weights[p + "mlp.gate.weight"] = router
