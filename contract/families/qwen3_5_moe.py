"""Qwen3.5-MoE (Hugging Face model_type "qwen3_5_moe_text", as `Qwen3_5MoeForCausalLM` saves
it): a hybrid. Most layers mix tokens with a Gated DeltaNet (linear attention: a causal conv,
then the gated delta rule over a recurrent state per request); every few layers attend
instead, with a sigmoid gate on attention's output and RoPE on part of each head. Every layer's
MLP is the mixture of experts (qwen3_moe.py) plus a shared expert behind a sigmoid gate, and
every RMSNorm but the DeltaNet's own scales by 1 + weight (zero-centred).

Structural, as Qwen3-MoE: only its own checkpoints have these layers.

A layer's Gated DeltaNet (`linear_attn.`), in save_pretrained's names:
  in_proj_qkv [2 * key_dim + value_dim, hidden]  q, k and v, before the conv
  in_proj_z   [value_dim, hidden]     the output norm's gate
  in_proj_b   [value heads, hidden]   beta = sigmoid(b): how much a token writes
  in_proj_a   [value heads, hidden]   the decay g = -exp(A_log) * softplus(a + dt_bias)
  conv1d      [conv_dim, 1, kernel]   the causal depthwise conv over q, k and v
  A_log, dt_bias [value heads]
  norm        [value head_dim]        RMSNorm of each head's output, times silu(z)
  out_proj    [hidden, value_dim]
"""
import math

import torch

from contract.families.feature import Feature

ORDER = 5
MODEL_TYPE = "qwen3_5_moe_text"
LINEAR, FULL = "linear_attention", "full_attention"
FEATURE = Feature("layer_types", "the Gated DeltaNet layers", off=(), probe=None, is_structural=True)
# What its config.json implies without saying: Qwen3's q/k norms, and the parts of its
# attention, norms and router that have no key of their own.
TURNS_ON = {"qk_norm": True, "attn_output_gate": True, "zero_centred_norm": True, "norm_topk_prob": True}
ROTATED = ()  # q_proj (with its gate rows), k_proj and the q/k norms: their RoPE rows are dense's and qwen3's
REFERENCE = ("ReferenceModel.gated_delta_net", "ReferenceModel.attention", "ReferenceModel.rms_norm",
             "ReferenceModel.moe")  # fitness/reference.py
# seed_engine/engine.py; each joins mutations/program.GENES with its first allele (until then
# a helper, which program.finish brings into a program that lacks it).
SEED_GENES = ("causal_conv", "delta_rule_chunked", "delta_rule_step", "gated_delta_net", "gated_query",
              "gate_output", "RecurrentState", "plus_shared_expert", "delta_net_decode", "delta_net_prefill",
              "delta_gates", "gated_rms_norm", "delta_rule_inputs", "prompt_convs", "chunk_systems")
# The DeltaNet's sizes, with the defaults transformers' Qwen3_5MoeTextConfig gives a config.json without them.
LINEAR_KEYS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
               "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
FULL_ATTENTION_INTERVAL = 4  # transformers' default when config.json lists no layer_types


def hf_fields(raw: dict) -> dict:
    """Its config.json's own keys under ModelConfig's names: the layer types (every
    full_attention_interval-th layer attends when none are listed), the DeltaNet's sizes,
    the shared expert and the share of each head RoPE turns."""
    from contract.families import qwen3_moe

    layers = raw.get("num_hidden_layers")
    types = raw.get("layer_types")
    if types is None and isinstance(layers, int):
        interval = raw.get("full_attention_interval") or FULL_ATTENTION_INTERVAL
        types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]
    rope = raw.get("rope_parameters") or {}
    fields = {key: raw.get(key, default) for key, default in LINEAR_KEYS.items()}
    if "shared_expert_intermediate_size" in raw:
        fields["shared_expert_intermediate_size"] = raw["shared_expert_intermediate_size"]
    # Every layer's MLP has experts: the dense width, which the contract's config requires,
    # is no layer's (the experts' stands in).
    fields["intermediate_size"] = raw.get("intermediate_size") or raw.get("moe_intermediate_size")
    return {**qwen3_moe.hf_fields(raw), **fields, "layer_types": tuple(types or ()),
            "partial_rotary_factor": rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))}


def is_linear_layer(config: dict, layer: int) -> bool:
    return bool(config.get("layer_types")) and config["layer_types"][layer] == LINEAR


def linear_dims(config: dict) -> tuple:
    """(key_dim, value_dim, conv_dim): q and k are key_dim wide, v value_dim."""
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    return key_dim, value_dim, 2 * key_dim + value_dim


def mixer_weights(config: dict, prefix: str, layer: int) -> dict | None:
    """A Gated DeltaNet layer's tensors in place of attention's; None for an attention layer."""
    if not is_linear_layer(config, layer):
        return None
    hidden, heads = config["hidden_size"], config["linear_num_value_heads"]
    _, value_dim, conv_dim = linear_dims(config)
    p = prefix + "linear_attn."
    return {p + "in_proj_qkv.weight": (conv_dim, hidden), p + "in_proj_z.weight": (value_dim, hidden),
            p + "in_proj_b.weight": (heads, hidden), p + "in_proj_a.weight": (heads, hidden),
            p + "conv1d.weight": (conv_dim, 1, config["linear_conv_kernel_dim"]), p + "A_log": (heads,),
            p + "dt_bias": (heads,), p + "norm.weight": (config["linear_value_head_dim"],),
            p + "out_proj.weight": (hidden, value_dim)}


def attention_weights(config: dict, prefix: str) -> dict:
    """Its attention's gate rows are q_proj's (layout.q_rows), its q/k norms Qwen3's."""
    return {}


def toy_weight(name: str, shape: tuple, std):
    """The DeltaNet's vectors: decay rates A in [1, 16] (as log), dt_bias as toy_dt_bias says,
    the output norm around 1, the conv's taps at 1/sqrt(kernel). None for a tensor not its own."""
    if name.endswith("linear_attn.A_log"):
        return torch.empty(shape).uniform_(1, 16).log()
    if name.endswith("linear_attn.dt_bias"):
        return toy_dt_bias(shape)
    if name.endswith("linear_attn.norm.weight"):
        return around_one(shape)
    if name.endswith("linear_attn.conv1d.weight"):
        return torch.randn(shape) / math.sqrt(shape[-1])
    return None


def toy_dt_bias(shape: tuple) -> torch.Tensor:
    """Even heads forget slowly, as Mamba-2 and flash-linear-attention initialise them (the step
    dt log-uniform in [0.001, 0.1], kept as its inverse softplus): the state holds tens of
    tokens, where a decay or a write strength a tenth off shows. Odd heads forget fast, as
    transformers initialises them (around 1: a token or two). With fast heads alone the gate
    in bf16 could not tell those two faults from the seed's rounding
    (docs/log/2026-12-01-slow-decays-in-the-judges-weights.md)."""
    dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(0.1)).exp()
    slow, fast = dt + torch.log(-torch.expm1(-dt)), around_one(shape)
    return torch.where(torch.arange(shape[0]) % 2 == 0, slow, fast)


def around_one(shape: tuple) -> torch.Tensor:
    """1 + N(0, 1/16)."""
    return 1 + torch.randn(shape) / 4


def check(config) -> list:
    """What is wrong with a ModelConfig's hybrid fields (empty when nothing)."""
    problems = []
    if len(config.layer_types) != config.num_hidden_layers or set(config.layer_types) - {LINEAR, FULL}:
        problems.append(f"layer_types must give {LINEAR!r} or {FULL!r} for each of the {config.num_hidden_layers} "
                        f"layers, got {list(config.layer_types)}")
    sizes = {key: getattr(config, key) for key in LINEAR_KEYS}
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad:
        problems.append(f"a Gated DeltaNet needs positive integers, got {bad}")
    elif config.linear_num_value_heads % config.linear_num_key_heads:
        problems.append(f"linear_num_value_heads ({config.linear_num_value_heads}) must be a multiple of "
                        f"linear_num_key_heads ({config.linear_num_key_heads})")
    return problems


def derived_layer_types(layers: int) -> tuple:
    """Layer types for a derived config of `layers` layers: DeltaNet layers, then one that
    attends, so that each config the gate judges has both."""
    return (LINEAR,) * (layers - 1) + (FULL,)
