"""Seed engine: the simplest correct KV-cached engine, written in gene form.

It reads the contract's format (model_config.json, model.pt) and a Hugging Face directory
(config.json, safetensors) of Llama, Qwen2, Qwen3, Qwen3-MoE or Qwen3.5-MoE: `read_config` and
`read_tensors` turn the latter into the former's keys, names and interleaved RoPE rows, so
everything after them sees one layout.

Each concern is one top-level name (a gene) that a rewrite can find and swap:
  compute_dtype   the reference's dtype rule
  load_weights    weight layout on the device (a tied head is the embedding table)
  rms_norm        normalisation
  add_rms_norm    residual add, then normalisation (one boundary, so a kernel can fuse them)
  rope_frequencies  RoPE inverse frequencies, with Llama 3's scaling when the config has it
  rope_tables     cos/sin for the positions of one call
  apply_rope      interleaved-pair rotation
  qkv_proj        q, k, v projections
  add_qkv_bias    q, k, v biases (Qwen2), when the checkpoint has them
  norm_qkv        the norm before attention, then q, k, v (one boundary, so a kernel can fold
                  the norm into the projection)
  norm_heads      RMSNorm over each head of q and k (Qwen3), when the checkpoint has it
  attention_inputs  q and k normed and rotated, k and v into the cache (one boundary, so a
                  kernel can fuse them)
  mlp             SwiGLU
  route           an MoE router (Qwen3-MoE): softmax over experts in fp32, top-k, renormalised
  dispatch        the packed tokens grouped by the expert they go to
  experts_swiglu  each expert's SwiGLU over its tokens
  combine         the experts' outputs weighted by the router and summed per token
  plus_shared_expert  a shared expert beside the routed ones, behind a sigmoid gate (Qwen3.5)
  moe             a sparse layer's MLP: route, dispatch, experts_swiglu, combine (and the shared expert)
  norm_mlp        the norm before the MLP, then the MLP or, in a sparse layer, moe (one
                  boundary, as norm_qkv)
  gated_query     a gated attention's q split from its gate (Qwen3.5)
  gate_output     attention's output times sigmoid(gate)
  RecurrentState  a Gated DeltaNet's state per request and layer: the conv's last inputs
                  and the delta rule's matrix (Qwen3.5)
  causal_conv     the DeltaNet's causal depthwise conv, carried from a state
  delta_rule_chunked  the gated delta rule over a prompt, a chunk of tokens at a time
  delta_rule_step     the gated delta rule for one token of each request
  gated_delta_net the DeltaNet layer: projections, conv, delta rule, gated norm
  KVCache         where K/V live: one tensor per request and layer
  attend_prefill  prompt attention, one request at a time
  attend_decode   one-token attention: gather, pad, mask
  attention       attention_inputs, then the step's attend (one boundary, so a kernel can
                  ready q and k where it reads the cache)
  Engine          batching: every call's tokens go through one packed forward pass, a
                  decoder_layer at a time
  create_engine   the contract's entry point

Every size comes from the config or the weights; imports are stdlib and torch only
(and safetensors, where a Hugging Face checkpoint is read).
"""
from dataclasses import dataclass
import json
import math
import os
import re

import torch
import torch.nn.functional as F


def compute_dtype(model_config, device):
    """fp32 on CPU; on CUDA bf16 when the config asks for it, otherwise fp16."""
    if not str(device).startswith("cuda"):
        return torch.float32
    name = str(model_config.get("torch_dtype", "float16")).lower()
    return torch.bfloat16 if name in ("bfloat16", "bf16") else torch.float16


def rope_rows(rows, name, model_config):
    """A q/k tensor's rows moved from rotate-half to interleaved order: within each head's
    first rotary_dim rows (all but in Qwen3.5, whose q_proj also has each head's gate rows
    after its query rows, which stay)."""
    head_dim, rotary = model_config["head_dim"], model_config["rotary_dim"]
    order = torch.arange(2 * head_dim if model_config["attn_output_gate"] and ".q_proj." in name else head_dim)
    order[:rotary] = torch.arange(rotary).view(2, rotary // 2).T.reshape(-1)  # [0, half, 1, half + 1, ...]
    return rows.reshape(-1, len(order), *rows.shape[1:])[:, order].reshape(rows.shape)

# A Hugging Face checkpoint's q/k rows (with their biases and norm weights) pair dimension
# i with i + head_dim/2 for RoPE; these are permuted to pair 2i with 2i + 1.
ROTATE_HALF_ROWS = re.compile(r"self_attn\.(q_proj|k_proj|q_norm|k_norm)\.")


def read_tensors(weight_dir, model_config):
    """Every tensor of the checkpoint (CPU): model.pt as it is, or a Hugging Face
    checkpoint (one safetensors file, or shards named by its index) in model.pt's names and
    interleaved RoPE rows."""
    if os.path.exists(os.path.join(weight_dir, "model.pt")):
        # mmap: tensors read straight from the page cache as they go to the device (no
        # copy of the whole checkpoint first; half of making an engine was that copy)
        return torch.load(os.path.join(weight_dir, "model.pt"), map_location="cpu", weights_only=True, mmap=True)
    from safetensors.torch import load_file

    index = os.path.join(weight_dir, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for name in files:
        tensors.update(load_file(os.path.join(weight_dir, name)))
    return {name.removeprefix("model."): rope_rows(t, name, model_config) if ROTATE_HALF_ROWS.search(name) else t
            for name, t in tensors.items()}

# Per layer: the seed's key -> the checkpoint's name, then those only some families have,
# then a dense layer's MLP (a sparse one has a router and experts instead: EXPERT_TENSORS).
LAYER_TENSORS = {"input_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight",
                 "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
                 "o": "self_attn.o_proj.weight", "post_norm": "post_attention_layernorm.weight"}

# A Gated DeltaNet layer's (Qwen3.5), under linear_attn.; its out_proj is the layer's "o".
LINEAR_TENSORS = {"qkv": "in_proj_qkv.weight", "z": "in_proj_z.weight", "b": "in_proj_b.weight",
                  "a": "in_proj_a.weight", "conv": "conv1d.weight", "norm": "norm.weight"}

LINEAR_FP32_TENSORS = {"A_log": "A_log", "dt_bias": "dt_bias"}  # the decay's, read in fp32


def read_linear_attention(get, raw, model_config, prefix):
    """A Gated DeltaNet layer's tensors and sizes: LINEAR_TENSORS' keys (the conv's [C, 1,
    kernel]), LINEAR_FP32_TENSORS' in fp32, the head counts and dims."""
    p = prefix + "linear_attn."
    linear = {key: get(p + name) for key, name in LINEAR_TENSORS.items()}
    linear.update({key: raw[p + name].to(device=linear["qkv"].device, dtype=torch.float32)
                   for key, name in LINEAR_FP32_TENSORS.items()})
    linear.update(key_heads=model_config["linear_num_key_heads"], value_heads=model_config["linear_num_value_heads"],
                  key_dim=model_config["linear_key_head_dim"], value_dim=model_config["linear_value_head_dim"])
    return {"linear": linear, "o": get(p + "out_proj.weight")}

OPTIONAL_LAYER_TENSORS = {"q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias",
                          "v_bias": "self_attn.v_proj.bias", "q_norm": "self_attn.q_norm.weight",
                          "k_norm": "self_attn.k_norm.weight"}


def gate_rows_last(rows, heads):
    """A gated q_proj's rows (or bias), each head's query then its gate, as every head's
    query rows, then every head's gate rows: one matmul gives q and the gate side by side."""
    return rows.reshape(heads, 2, -1, *rows.shape[1:]).transpose(0, 1).reshape(rows.shape)

# Qwen3.5's norms scale by 1 + weight: read as that sum (in fp32, then cast), they are RMSNorms as any.
ZERO_CENTRED_NORMS = ("input_norm", "post_norm", "q_norm", "k_norm")


def is_sparse_layer(model_config, index):
    """Whether layer `index` has experts (transformers' Qwen3MoeDecoderLayer's rule)."""
    num_experts = model_config.get("num_experts") or 0
    step = model_config.get("decoder_sparse_step") or 1
    return index not in (model_config.get("mlp_only_layers") or ()) and num_experts > 0 and (index + 1) % step == 0

EXPERT_TENSORS = {"experts_gate": "gate_proj.weight", "experts_up": "up_proj.weight",
                  "experts_down": "down_proj.weight"}  # under mlp.experts.{e}., stacked [E, ...]

SHARED_EXPERT_TENSORS = {"shared_gate": "mlp.shared_expert.gate_proj.weight", "shared_up": "mlp.shared_expert.up_proj.weight",
                         "shared_down": "mlp.shared_expert.down_proj.weight",
                         "shared_expert_gate": "mlp.shared_expert_gate.weight"}  # a sparse layer's, in Qwen3.5

DENSE_MLP_TENSORS = {"gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight"}


def read_checkpoint(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype: one dict per layer (LAYER_TENSORS'
    keys, those of OPTIONAL_LAYER_TENSORS it has, and DENSE_MLP_TENSORS' or, in a sparse layer,
    "router" and EXPERT_TENSORS' (and SHARED_EXPERT_TENSORS', where it has them)), the
    embedding, final norm and head. A Gated DeltaNet layer (Qwen3.5) has its tensors under
    "linear" (read_linear_attention) in place of q, k, v; a gated attention's q its gate
    rows after its query rows (gate_rows_last)."""
    raw = read_tensors(weight_dir, model_config)

    def get(name):
        return raw[name].to(device=device, dtype=dtype)

    def plus_one(name):
        return (1 + raw[name].float()).to(device=device, dtype=dtype)

    layers = []
    for i in range(model_config["num_hidden_layers"]):
        p = f"layers.{i}."
        if model_config["layer_types"] and model_config["layer_types"][i] == "linear_attention":
            layer = {key: get(p + LAYER_TENSORS[key]) for key in ("input_norm", "post_norm")}
            layer.update(read_linear_attention(get, raw, model_config, p))
        else:
            layer = {key: get(p + name) for key, name in LAYER_TENSORS.items()}
            layer.update({key: get(p + name) for key, name in OPTIONAL_LAYER_TENSORS.items() if p + name in raw})
        if model_config["attn_output_gate"] and "q" in layer:
            layer["output_gate"] = True
            for key in ("q", "q_bias"):
                if key in layer:
                    layer[key] = gate_rows_last(layer[key], model_config["num_attention_heads"])
        if model_config["zero_centred_norm"]:
            names = {**LAYER_TENSORS, **OPTIONAL_LAYER_TENSORS}
            layer.update({key: plus_one(p + names[key]) for key in ZERO_CENTRED_NORMS if key in layer})
        if is_sparse_layer(model_config, i):
            layer["router"] = get(p + "mlp.gate.weight")  # [E, hidden]
            layer["top_k"], layer["renormalise"] = model_config["num_experts_per_tok"], model_config["norm_topk_prob"]
            for key, name in EXPERT_TENSORS.items():  # [E, inter, hidden], down [E, hidden, inter]
                layer[key] = torch.stack([get(f"{p}mlp.experts.{e}.{name}") for e in range(model_config["num_experts"])])
            layer.update({key: get(p + name) for key, name in SHARED_EXPERT_TENSORS.items() if p + name in raw})
        else:
            layer.update({key: get(p + name) for key, name in DENSE_MLP_TENSORS.items()})
        layers.append(layer)
    embed = get("embed_tokens.weight")
    # Tied: the head is the embedding table itself, unless the checkpoint stores a head of
    # its own anyway (transformers 5 then keeps that one).
    is_tied = model_config.get("tie_word_embeddings") and "lm_head.weight" not in raw
    head = embed if is_tied else get("lm_head.weight")
    norm = plus_one("norm.weight") if model_config["zero_centred_norm"] else get("norm.weight")
    return {"embed": embed, "layers": layers, "norm": norm, "lm_head": head}


def load_weights(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype, one dict per layer."""
    return read_checkpoint(model_config, weight_dir, device, dtype)


def rms_norm(x, weight, eps):
    # Normalise in fp32, cast back, then scale: the reference's order of rounding.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) * weight


def add_rms_norm(x, residual, weight, eps):
    """(rms_norm(x + residual), x + residual): the sum is the new residual stream."""
    x = x + residual
    return rms_norm(x, weight, eps), x


def rope_frequencies(head_dim, theta, scaling, device):
    """inv_freq [head_dim/2] in fp32; with Llama 3's `scaling` (LLAMA3_KEYS' values), those
    of wavelength above original context / low_freq_factor slowed by `factor`, those under
    context / high_freq_factor kept, those between blended."""
    exponent = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponent)
    if scaling is None:
        return inv_freq
    factor, low, high, context = scaling
    wavelength = 2 * math.pi / inv_freq
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > context / low, inv_freq / factor, blended)
    return torch.where(wavelength < context / high, inv_freq, scaled)


def rope_tables(positions, head_dim, theta, dtype, scaling):
    """cos and sin [N, head_dim/2] for absolute positions [N], computed in fp32."""
    inv_freq = rope_frequencies(head_dim, theta, scaling, positions.device)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [N, head_dim/2]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin):
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x [N, heads, head_dim], over the first
    2 * cos.shape[-1] dimensions of each head (all but in Qwen3.5); the rest as they are."""
    rotary = 2 * cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    x0, x1 = x[..., 0::2], x[..., 1::2]  # [N, heads, head_dim/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    # .to: a checkpoint's fp32 tables (rope_table_dtype) give fp32 products.
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(x.dtype)


def qkv_proj(x, layer):
    """q [N, heads*head_dim], k and v [N, kv_heads*head_dim] from x [N, hidden]."""
    return x @ layer["q"].T, x @ layer["k"].T, x @ layer["v"].T


def add_qkv_bias(q, k, v, layer):
    """q, k, v plus their biases, where the checkpoint has them (Qwen2)."""
    if "q_bias" not in layer:
        return q, k, v
    return q + layer["q_bias"], k + layer["k_bias"], v + layer["v_bias"]


def pre_norm(x, residual, weight, eps):
    """(rms_norm(x + residual), x + residual); (rms_norm(x), x) where residual is None."""
    if residual is None:
        return rms_norm(x, weight, eps), x
    return add_rms_norm(x, residual, weight, eps)


def norm_qkv(x, residual, weight, layer, eps):
    """(q, k, v, x + residual): q, k, v (biases added) of rms_norm(x + residual), and the sum,
    the new residual stream; the first layer passes residual None."""
    h, x = pre_norm(x, residual, weight, eps)
    return (*add_qkv_bias(*qkv_proj(h, layer), layer), x)


def norm_heads(q, k, layer, eps):
    """RMSNorm over each head of q [N, heads, D] and k [N, kv_heads, D], where the
    checkpoint has the norms (Qwen3: before RoPE)."""
    if "q_norm" not in layer:
        return q, k
    return rms_norm(q, layer["q_norm"], eps), rms_norm(k, layer["k_norm"], eps)


def adjacent_heads(q, k):
    """q [N, H, D] and k [N, KV, D] as one [N, H + KV, D] view when k's heads follow q's in
    one tensor's storage (the split of a fused projection), else None. Two tensors can sit
    end to end in memory (the allocator's blocks do), but a view may not span both.
    A single token's views carry their own widths as row strides (torch's view of one row),
    which no access reads: at N = 1 the rows' strides may differ."""
    if q.shape[0] == 0 or q.stride()[1:] != k.stride()[1:] or q.stride(1) != q.shape[2]:
        return None
    if q.shape[0] > 1 and q.stride(0) != k.stride(0):
        return None
    if q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr():
        return None
    if k.data_ptr() != q.data_ptr() + q.shape[1] * q.shape[2] * q.element_size():
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())


def rotate_heads(q, k, cos, sin):
    """q and k rotated: in one apply_rope call where k's heads follow q's in one tensor
    (elementwise, so the same values as two calls, in half the launches)."""
    both = adjacent_heads(q, k)  # None once a bias or norm made q and k new tensors
    if both is None:
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    both = apply_rope(both, cos, sin)
    return both[:, :q.shape[1]], both[:, q.shape[1]:]


def attention_inputs(q, k, v, layer, cos, sin, cache, step, index, eps):
    """q and k [N, heads, D] as attention reads them (each head normed where the checkpoint
    has the norms, then rotated), once k and v [N, kv_heads, D] are in the cache's layer
    `index`."""
    q, k = rotate_heads(*norm_heads(q, k, layer, eps), cos, sin)
    cache.write(index, step, k, v)
    return q, k


def mlp(x, layer):
    return (F.silu(x @ layer["gate"].T) * (x @ layer["up"].T)) @ layer["down"].T


def route(x, layer, logits=None):
    """(weights [N, k] in x's dtype, experts [N, k]) for x [N, hidden]: softmax over every
    expert in fp32, the top k, renormalised to sum to 1 where the config says so. logits:
    x @ router.T where the caller made them (a norm folded into the router's projection)."""
    if logits is None:
        logits = x @ layer["router"].T  # [N, E]
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, layer["top_k"], dim=-1)
    if layer["renormalise"]:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(x.dtype), experts


def dispatch(experts, num_experts):
    """(order, counts): the flat indices into experts [N, k] of every (token, slot) pair,
    sorted by expert, and how many pairs go to each expert [E]."""
    order = torch.argsort(experts.flatten(), stable=True)  # [N*k]
    return order, torch.bincount(experts.flatten(), minlength=num_experts)


def experts_swiglu(rows, counts, layer):
    """Each expert's SwiGLU over the rows sent to it: rows [N*k, hidden] grouped by expert
    (counts [E] of them each) -> [N*k, hidden] in the same order."""
    outs = []
    for e, rows_e in enumerate(rows.split(counts.tolist())):  # rows_e [count_e, hidden]
        hidden = F.silu(rows_e @ layer["experts_gate"][e].T) * (rows_e @ layer["experts_up"][e].T)
        outs.append(hidden @ layer["experts_down"][e].T)
    return torch.cat(outs)


def combine(outs, order, weights):
    """The experts' outputs [N*k, hidden] (dispatch's order) weighted by the router and summed
    per token: [N, hidden]."""
    n, k = weights.shape
    weighted = outs * weights.flatten()[order, None]
    total = torch.zeros(n, outs.shape[1], dtype=outs.dtype, device=outs.device)
    return total.index_add_(0, order // k, weighted)  # flat index // k: the token


def sorted_experts(x, weights, experts, layer):
    """The router-weighted sum [N, hidden] of each token's experts' SwiGLU (weights and
    experts [N, k]), the pairs sorted by expert: dispatch, each expert's SwiGLU, combine."""
    order, counts = dispatch(experts, layer["router"].shape[0])
    rows = x[order // experts.shape[1]]  # [N*k, hidden]: each token once per expert it goes to
    return combine(experts_swiglu(rows, counts, layer), order, weights)


def plus_shared_expert(out, x, layer):
    """The experts' output `out` [N, hidden] plus, where the layer has one (Qwen3.5), the
    shared expert's SwiGLU of x [N, hidden] behind its sigmoid gate."""
    if "shared_expert_gate" not in layer:
        return out
    shared = (F.silu(x @ layer["shared_gate"].T) * (x @ layer["shared_up"].T)) @ layer["shared_down"].T
    return out + torch.sigmoid(x @ layer["shared_expert_gate"].T) * shared


def moe(x, layer, logits=None):
    """A sparse layer's MLP over x [N, hidden]: route, then the chosen experts (and a shared
    one). logits: the router's, where the caller made them (route's)."""
    weights, experts = route(x, layer, logits)
    return plus_shared_expert(sorted_experts(x, weights, experts, layer), x, layer)


def norm_mlp(x, residual, weight, layer, eps):
    """(mlp(rms_norm(x + residual)), x + residual): the MLP's output (the experts' in a sparse
    layer, which has a router) and the new residual stream."""
    h, x = add_rms_norm(x, residual, weight, eps)
    return (moe(h, layer) if "router" in layer else mlp(h, layer)), x

# The Hugging Face families read (config.json's model_type), whose gate is fp32: the
# judge's contract.families.HF_FAMILIES, written here because an engine file stands alone.
HF_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5_moe_text")


def rounds_like_reference(model_config, dtype):
    """Whether attention must round its probabilities to the compute dtype before @ v, as
    the contract's reference does: bf16 in the contract's format. A Hugging Face checkpoint
    is judged against fp32 under a calibrated allowance (fitness.reference_logits), where a
    fused kernel's fp32 probabilities come closer, so its fast paths stay on."""
    return dtype == torch.bfloat16 and model_config.get("model_type") not in HF_MODEL_TYPES


class KVCache:
    """Per-request K/V: for each request, a list of [T, kv_heads, head_dim] per layer."""

    def __init__(self, model_config, device, dtype):
        self.num_layers = model_config["num_hidden_layers"]
        self.reference_rounding = rounds_like_reference(model_config, dtype)  # read by attention alleles
        self.k = {}
        self.v = {}
        self.lengths = {}  # tokens seen per request (a hybrid's DeltaNet layers keep no K/V)

    def length(self, request_id):
        return self.lengths[request_id]

    def prepare(self, step):
        # A prefill replaces whatever the request had.
        if not step.is_decode:
            for rid in step.request_ids:
                self.k[rid] = [None] * self.num_layers
                self.v[rid] = [None] * self.num_layers
        for rid, start, new in zip(step.request_ids, step.start, step.num_new):
            self.lengths[rid] = start + new

    def write(self, layer, step, k, v):
        """Append packed k, v [N, kv_heads, head_dim] to each request's cache."""
        for rid, k_r, v_r in zip(step.request_ids, k.split(step.num_new), v.split(step.num_new)):
            old_k, old_v = self.k[rid][layer], self.v[rid][layer]
            self.k[rid][layer] = k_r if old_k is None else torch.cat((old_k, k_r))
            self.v[rid][layer] = v_r if old_v is None else torch.cat((old_v, v_r))

    def read(self, layer, request_id):
        return self.k[request_id][layer], self.v[request_id][layer]

    def remove(self, request_ids):
        for rid in request_ids:
            self.k.pop(rid, None)
            self.v.pop(rid, None)
            self.lengths.pop(rid, None)


def masked_attention(q, k, v, mask):
    """The reference's math: fp32 scores and softmax, probabilities cast back, then @ v.

    q [B, heads, Tq, D]; k, v [B, kv_heads, Tk, D]; mask broadcastable to [B, 1, Tq, Tk].
    """
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # GQA: [B, heads, Tk, D]
    v = v.repeat_interleave(groups, dim=1)
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v  # [B, heads, Tq, D]


def attend_prefill(q, k, v, cache, layer, step):
    """Causal attention over each prompt alone: q [N, heads, D] -> [N, heads*D]."""
    outs = []
    for q_r, k_r, v_r in zip(q.split(step.num_new), k.split(step.num_new), v.split(step.num_new)):
        t = q_r.shape[0]
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        out = masked_attention(q_r.transpose(0, 1)[None], k_r.transpose(0, 1)[None],
                               v_r.transpose(0, 1)[None], causal)  # [1, heads, t, D]
        outs.append(out[0].transpose(0, 1).flatten(1))  # [t, heads*D]
    return torch.cat(outs)


def attend_decode(q, k, v, cache, layer, step):
    """Each request's one query over its whole cache, padded to the longest: [B, heads, D]."""
    keys, values = zip(*(cache.read(layer, rid) for rid in step.request_ids))
    keys = torch.nn.utils.rnn.pad_sequence(keys, batch_first=True)  # [B, L, kv_heads, D]
    values = torch.nn.utils.rnn.pad_sequence(values, batch_first=True)
    # The new token sits at its position, so a request sees keys 0..position; the lengths
    # are already on the device (a host list here would sync the GPU every layer).
    valid = torch.arange(keys.shape[1], device=q.device)[None, :] <= step.positions[:, None]  # [B, L]
    out = masked_attention(q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2),
                           valid[:, None, None, :])  # [B, heads, 1, D]
    return out.flatten(1)


def attention(q, k, v, layer, cos, sin, cache, step, index, eps):
    """A layer's attention [N, heads*D] of q [N, heads, D], k and v [N, kv_heads, D] as
    projected: attention_inputs readies q and k and stores k and v, then the step's attend
    reads the cache."""
    q, k = attention_inputs(q, k, v, layer, cos, sin, cache, step, index, eps)
    attend = attend_decode if step.is_decode else attend_prefill
    return attend(q, k, v, cache, index, step)


class RecurrentState:
    """A Gated DeltaNet's state (Qwen3.5), per request and layer: the conv's last kernel - 1
    inputs [conv_dim, kernel - 1] in the compute dtype, and the delta rule's matrix
    [value heads, key dim, value dim] in fp32. A prefill creates it, decode carries it,
    remove frees it."""

    def __init__(self, model_config, device):
        self.conv = {}  # request -> {layer: [conv_dim, kernel - 1]}
        self.matrix = {}  # request -> {layer: [heads, key dim, value dim]}

    def prepare(self, step):
        """Nothing to ready: a prefill's write replaces a request's states."""

    def read(self, layer, step):
        """(conv [B, conv_dim, kernel - 1], matrix [B, heads, key dim, value dim]) of the step's requests."""
        return (torch.stack([self.conv[rid][layer] for rid in step.request_ids]),
                torch.stack([self.matrix[rid][layer] for rid in step.request_ids]))

    def write(self, layer, step, conv, matrix):
        """The step's requests' new states (one row each of conv and matrix)."""
        for rid, conv_r, matrix_r in zip(step.request_ids, conv, matrix):
            self.conv.setdefault(rid, {})[layer] = conv_r
            self.matrix.setdefault(rid, {})[layer] = matrix_r

    def remove(self, request_ids):
        for rid in request_ids:
            self.conv.pop(rid, None)
            self.matrix.pop(rid, None)


def causal_conv(x, state, weight):
    """SiLU of the causal depthwise conv of x [B, C, T], carried on from `state` [B, C,
    kernel - 1] (the inputs before x; zeros for a new request), with weight [C, 1, kernel]:
    (out [B, C, T], the new state: the last kernel - 1 inputs)."""
    full = torch.cat((state, x), dim=-1)  # [B, C, kernel - 1 + T]
    out = F.conv1d(full, weight, groups=x.shape[1])  # no padding: the state is the past
    return F.silu(out), full[:, :, full.shape[-1] - state.shape[-1]:]


def delta_rule_step(q, k, v, log_decay, beta, state):
    """The gated delta rule for one token of each of B requests: q, k [B, H, Dk], v [B, H, Dv],
    log_decay and beta [B, H], state [B, H, Dk, Dv], fp32 -> (out [B, H, Dv], the new state)."""
    state = state * log_decay.exp()[..., None, None]
    predicted = (k[..., None] * state).sum(-2)  # [B, H, Dv]: what the state recalls for k
    state = state + k[..., None] * ((v - predicted) * beta[..., None])[..., None, :]
    return (q[..., None] * state).sum(-2), state


def delta_rule_inputs(mixed, lin):
    """q, k [N, value heads, key dim] (unit length, q scaled; each key head serving a run of
    value heads) and v [N, value heads, value dim], fp32, from the conv's output [N, conv_dim]."""
    key_dim, key_width = lin["key_dim"], lin["key_heads"] * lin["key_dim"]
    q, k, v = mixed.float().split((key_width, key_width, lin["value_heads"] * lin["value_dim"]), -1)
    q, k = (t.view(len(t), -1, key_dim).repeat_interleave(lin["value_heads"] // lin["key_heads"], 1) for t in (q, k))
    q, k = (t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) + 1e-6) for t in (q, k))
    return q / math.sqrt(key_dim), k, v.view(len(v), lin["value_heads"], lin["value_dim"])


def delta_net_decode(mixed, log_decay, beta, lin, states, step, index):
    """One token of each request through its carried conv and delta-rule state, from the
    projections mixed [B, conv_dim], log_decay and beta [B, value heads] -> [B, value heads,
    value dim] (fp32); the states carried on."""
    conv_state, matrix = states.read(index, step)
    mixed, conv_state = causal_conv(mixed[:, :, None], conv_state, lin["conv"])  # [B, conv_dim, 1]
    out, matrix = delta_rule_step(*delta_rule_inputs(mixed[:, :, 0], lin), log_decay, beta, matrix)
    states.write(index, step, conv_state, matrix)
    return out


def prompt_convs(mixed, lin, step):
    """causal_conv over each prompt of mixed [N, conv_dim] from a zero state: (out [N,
    conv_dim], each prompt's conv state [B, conv_dim, kernel - 1])."""
    conv_dim, kernel = mixed.shape[1], lin["conv"].shape[-1]
    outs, conv_states = [], []
    for part in mixed.T.split(step.num_new, dim=1):
        fresh = torch.zeros(1, conv_dim, kernel - 1, dtype=mixed.dtype, device=mixed.device)
        out, conv_state = causal_conv(part[None], fresh, lin["conv"])
        outs.append(out[0].T)
        conv_states.append(conv_state[0])
    return torch.cat(outs), torch.stack(conv_states)

DELTA_CHUNK = 64  # tokens a chunk of the delta rule's prefill solves at once


def chunk_systems(q, k, v, log_decay, beta):
    """What each DELTA_CHUNK tokens of the delta rule need, solved for all chunks at once:
    q, k [H, chunks, C, Dk], v [H, chunks, C, Dv], log_decay and beta [H, chunks, C] ->
    (u, w, G, attention): with G the decay summed from the chunk's start,
    u = (I + A)^-1 (beta v) and w = (I + A)^-1 (beta k exp(G)), where A[i, j] = beta_i
    k_i.k_j exp(G_i - G_j) below the diagonal; attention = (q k') exp(G_i - G_j), causal with
    its diagonal (FLA's and transformers' chunked form)."""
    decay = log_decay.cumsum(-1)  # G
    lower = torch.ones(DELTA_CHUNK, DELTA_CHUNK, dtype=torch.bool, device=q.device).tril()
    between = (decay[..., :, None] - decay[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # exp(G_i - G_j)
    k_beta = k * beta[..., None]
    system = ((k_beta @ k.transpose(-1, -2)) * between).tril(-1) + torch.eye(DELTA_CHUNK, device=q.device)
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False)
    w = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False)
    return u, w, decay, (q @ k.transpose(-1, -2)) * between


def delta_rule_chunked(q, k, v, log_decay, beta, state):
    """The gated delta rule over one request's tokens, a chunk at a time: q, k [T, H, Dk]
    (unit length; q scaled), v [T, H, Dv], log_decay and beta [T, H], state [H, Dk, Dv],
    all fp32 -> (out [T, H, Dv], the state after them).

    Token by token the state S decays by exp(g), then S += k (beta (v - S'k))' and q reads
    it. Within a chunk those writes are one lower-triangular solve (chunk_systems); then the
    chunk's new values are u - w S, its output q exp(G) S plus its causal attention over
    them, and S moves on to the chunk's end."""
    tokens, heads = q.shape[:2]
    pad = -tokens % DELTA_CHUNK
    q, k, v, log_decay, beta = (F.pad(t.transpose(0, 1), (0, 0) * (t.dim() - 2) + (0, pad))
                                for t in (q, k, v, log_decay, beta))  # [H, T', ...]: padding writes nothing
    q, k, v = (t.reshape(heads, -1, DELTA_CHUNK, t.shape[-1]) for t in (q, k, v))  # [H, chunks, C, D]
    u, w, decay, attention = chunk_systems(q, k, v, log_decay.reshape(heads, -1, DELTA_CHUNK),
                                           beta.reshape(heads, -1, DELTA_CHUNK))
    out = torch.empty_like(v)
    for c in range(q.shape[1]):
        new = u[:, c] - w[:, c] @ state  # [H, C, Dv]
        out[:, c] = (q[:, c] * decay[:, c, :, None].exp()) @ state + attention[:, c] @ new
        to_end = (decay[:, c, -1:] - decay[:, c]).exp()[..., None]  # [H, C, 1]
        state = state * decay[:, c, -1, None, None].exp() + (k[:, c] * to_end).transpose(-1, -2) @ new
    return out.reshape(heads, -1, v.shape[-1])[:, :tokens].transpose(0, 1), state


def delta_net_prefill(mixed, log_decay, beta, lin, states, step, index):
    """Each prompt's conv from a zero state and its delta rule a chunk at a time, from the
    projections mixed [N, conv_dim], log_decay and beta [N, value heads] -> [N, value heads,
    value dim] (fp32); the requests' new states written."""
    convolved, conv_states = prompt_convs(mixed, lin, step)
    q, k, v = delta_rule_inputs(convolved, lin)
    zero = torch.zeros(lin["value_heads"], lin["key_dim"], lin["value_dim"], device=mixed.device)
    parts = [delta_rule_chunked(*t, zero) for t in zip(*(t.split(step.num_new) for t in (q, k, v, log_decay, beta)))]
    states.write(index, step, conv_states, torch.stack([p[1] for p in parts]))
    return torch.cat([p[0] for p in parts])


def delta_gates(x, lin):
    """(log_decay, beta) [N, value heads] in fp32 for the normed x [N, hidden]: each head's
    decay exp(-exp(A_log) softplus(x a' + dt_bias)), as its log, and its write strength
    sigmoid(x b')."""
    beta = torch.sigmoid(x @ lin["b"].T).float()
    return -lin["A_log"].exp() * F.softplus((x @ lin["a"].T).float() + lin["dt_bias"]), beta


def gated_rms_norm(out, z, weight, eps):
    """Each head's output out [N, heads, value dim] (fp32) RMS-normed in z's dtype, times
    silu(z) [N, heads, value dim]: [N, heads * value dim] in z's dtype."""
    normed = rms_norm(out.to(z.dtype), weight, eps)  # transformers' delta rule hands its norm the compute dtype
    return (normed * F.silu(z.float())).to(z.dtype).flatten(1)


def rope_table_dtype(model_config, dtype):
    """cos/sin in the compute dtype, as the contract's reference rounds them; in fp32 for a
    Hugging Face checkpoint, whose gate is fp32 (a bf16 one's RoPE kernels need not then
    round like the reference's ops)."""
    return torch.float32 if model_config.get("model_type") in HF_MODEL_TYPES else dtype


def as_id_list(request_ids):
    if torch.is_tensor(request_ids):
        return [int(r) for r in request_ids.reshape(-1).tolist()]
    return [int(r) for r in request_ids]


@dataclass
class Step:
    """One call's batch: which requests, how much each has cached, how much it adds."""
    request_ids: list
    start: list  # tokens already cached per request
    num_new: list  # tokens this call adds per request
    positions: torch.Tensor  # [N] absolute position of every packed token
    is_decode: bool
    # Set by a KV cache's prepare when it addresses K/V by row (the seed's cache does not):
    slots: torch.Tensor = None  # [N] cache row of every packed token
    block_table: torch.Tensor = None  # [B, pages] page ids of every request
    # Set by a recurrent state's prepare when it keeps states in slots (the seed's does not):
    state_slots: torch.Tensor = None  # [B] state slot of every request


def gated_delta_net(x, layer, states, step, index, eps):
    """A Gated DeltaNet layer (Qwen3.5) over the packed normed x [N, hidden] -> [N, value
    heads * value dim], before out_proj: q, k, v projected and through causal_conv; the delta
    rule chunked over each prompt, a step per decoded token; each head's output RMS-normed,
    times silu(z)."""
    lin = layer["linear"]
    log_decay, beta = delta_gates(x, lin)
    mix = delta_net_decode if step.is_decode else delta_net_prefill
    out = mix(x @ lin["qkv"].T, log_decay, beta, lin, states, step, index)
    return gated_rms_norm(out, (x @ lin["z"].T).view(out.shape), lin["norm"], eps)


def gated_query(q, layer):
    """(q, gate): a gated attention's projection [N, 2 * heads*D] (every head's query, then
    every head's gate: read_checkpoint's order) split in two (Qwen3.5); else (q, None)."""
    if not layer.get("output_gate"):
        return q, None
    return q.chunk(2, dim=-1)


def gate_output(attn, gate):
    """Attention's output [N, heads*D] times sigmoid(gate), where attention is gated."""
    return attn if gate is None else attn * torch.sigmoid(gate)


def decoder_layer(x, out, layer, cos, sin, cache, states, step, index, head_dim, eps):
    """One layer over the packed residual stream x [N, hidden], given what the layer before
    adds to it (`out`; None at the first): (what this layer's MLP adds, the new stream).
    Its tokens mix through attention, or in a hybrid's DeltaNet layer (Qwen3.5) through
    gated_delta_net, then the MLP."""
    if "linear" in layer:
        h, x = pre_norm(x, out, layer["input_norm"], eps)
        mixed = gated_delta_net(h, layer, states, step, index, eps)
    else:
        q, k, v, x = norm_qkv(x, out, layer["input_norm"], layer, eps)
        q, gate = gated_query(q, layer)
        q, k, v = (t.view(x.shape[0], -1, head_dim) for t in (q, k, v))
        mixed = gate_output(attention(q, k, v, layer, cos, sin, cache, step, index, eps), gate)
        del q, k, v, gate  # not alive through the MLP, where a large prefill's peak is
    return norm_mlp(x, mixed @ layer["o"].T, layer["post_norm"], layer, eps)


class Engine:
    def __init__(self, model_config, weight_dir, device):
        self.device = torch.device(device)
        self.dtype = compute_dtype(model_config, device)
        self.rope_dtype = rope_table_dtype(model_config, self.dtype)
        self.num_heads = model_config["num_attention_heads"]
        self.num_kv_heads = model_config["num_key_value_heads"]
        self.head_dim = model_config["head_dim"]
        self.rotary_dim = model_config["rotary_dim"]  # the dimensions of each head RoPE turns
        self.eps = float(model_config.get("rms_norm_eps") or 1e-5)
        self.rope_theta = float(model_config.get("rope_theta") or 10000.0)
        self.rope_scaling = model_config.get("rope_scaling")
        self.w = load_weights(model_config, weight_dir, self.device, self.dtype)
        self.cache = KVCache(model_config, self.device, self.dtype)
        self.states = RecurrentState(model_config, self.device)  # a hybrid's DeltaNet layers' (Qwen3.5)

    @torch.no_grad()
    def prefill(self, request_ids, input_ids):
        ids = as_id_list(request_ids)
        lengths = [int(t.numel()) for t in input_ids]
        tokens = torch.cat([t.reshape(-1) for t in input_ids]).to(self.device, torch.long)
        positions = torch.cat([torch.arange(n) for n in lengths]).to(self.device)
        return self.forward(tokens, Step(ids, [0] * len(ids), lengths, positions, False))

    @torch.no_grad()
    def decode(self, request_ids, token_ids):
        ids = as_id_list(request_ids)
        start = [self.cache.length(rid) for rid in ids]
        positions = torch.tensor(start, device=self.device)
        tokens = token_ids.reshape(-1).to(self.device, torch.long)
        return self.forward(tokens, Step(ids, start, [1] * len(ids), positions, True))

    def remove(self, request_ids):
        self.cache.remove(as_id_list(request_ids))
        self.states.remove(as_id_list(request_ids))

    def forward(self, tokens, step):
        """Logits [B, vocab] of the last token of each request in `step`."""
        self.cache.prepare(step)
        self.states.prepare(step)
        cos, sin = rope_tables(step.positions, self.rotary_dim, self.rope_theta, self.rope_dtype, self.rope_scaling)
        x = self.w["embed"][tokens]  # [N, hidden]
        out = None  # what the last MLP adds to the residual stream x
        for i, layer in enumerate(self.w["layers"]):
            out, x = decoder_layer(x, out, layer, cos, sin, self.cache, self.states, step, i, self.head_dim, self.eps)
        x = x + out
        logits = rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T  # [N, vocab]
        last = torch.tensor(step.num_new, device=self.device).cumsum(0) - 1
        return logits[last]

LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def read_config(model_config):
    """The contract's keys, explicit, for a Hugging Face config.json too: head_dim and KV
    heads derived when absent, the dtype and RoPE read from either spelling (transformers 5
    writes `dtype` and `rope_parameters`; before, `torch_dtype`, `rope_theta`, `rope_scaling`).
    "rope_scaling" becomes None or the llama3 rule's LLAMA3_KEYS values, in order; a
    Qwen3-MoE's expert count is read under either name (transformers 5.24 writes num_local_experts).
    Qwen3.5's hybrid: its layer_types, what its model_type implies (a gated attention,
    zero-centred norms, renormalised routing) and rotary_dim, the dimensions RoPE turns."""
    config = dict(model_config)
    config["num_experts"] = config.get("num_experts") or config.get("num_local_experts") or 0
    heads = config["num_attention_heads"]
    config["num_key_value_heads"] = config.get("num_key_value_heads") or heads
    config["head_dim"] = config.get("head_dim") or config["hidden_size"] // heads
    config["torch_dtype"] = config.get("dtype") or config.get("torch_dtype") or "float16"
    hybrid = config.get("model_type") == "qwen3_5_moe_text"
    for key in ("attn_output_gate", "zero_centred_norm", "norm_topk_prob"):
        config[key] = config.get(key, hybrid)
    config["layer_types"] = tuple(config.get("layer_types") or ())
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    share = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    config["rotary_dim"] = int(config["head_dim"] * share)
    config["rope_theta"] = rope.get("rope_theta") or config.get("rope_theta") or 10000.0
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise ValueError(f"RoPE type {kind!r} is not served (default and llama3 are)")
    config["rope_scaling"] = tuple(float(rope[k]) for k in LLAMA3_KEYS) if kind == "llama3" else None
    return config


def create_engine(model_config: dict, weight_dir: str, device: str = "cuda"):
    model_config = read_config(model_config)
    return Engine(model_config, weight_dir, device)
