"""Recompute baseline: the public skeleton's approach, kept to be benchmarked beside the seed.

No KV cache: each request keeps its token list, and every prefill and decode call runs
the whole sequence again, one request at a time (batch size 1). Same math and dtype rules
as the reference and the seed engine. Self-contained: stdlib and torch only.
"""
import math
import os

import torch
import torch.nn.functional as F


def compute_dtype(model_config, device):
    """fp32 on CPU; on CUDA bf16 when the config asks for it, otherwise fp16."""
    if not str(device).startswith("cuda"):
        return torch.float32
    name = str(model_config.get("torch_dtype", "float16")).lower()
    return torch.bfloat16 if name in ("bfloat16", "bf16") else torch.float16


def load_weights(weight_dir, device, dtype):
    """Every checkpoint tensor on the device in the compute dtype, by its checkpoint name."""
    raw = torch.load(os.path.join(weight_dir, "model.pt"), map_location="cpu", weights_only=True)
    return {name: t.to(device=device, dtype=dtype) for name, t in raw.items()}


def rms_norm(x, weight, eps):
    # Normalise in fp32, cast back, then scale: the reference's order of rounding.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) * weight


def apply_rope(x, theta):
    """Rotate interleaved pairs of x [T, heads, head_dim] at positions 0 .. T-1."""
    seq_len, _, head_dim = x.shape
    exponent = torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim
    angles = torch.outer(torch.arange(seq_len, device=x.device, dtype=torch.float32),
                         1.0 / (theta ** exponent))  # [T, head_dim/2]
    cos = angles.cos().to(x.dtype)[:, None, :]  # broadcast over heads
    sin = angles.sin().to(x.dtype)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]  # [T, heads, head_dim/2] each
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def causal_attention(q, k, v):
    """q [T, heads, D], k and v [T, kv_heads, D] -> [T, heads*D]; fp32 scores and softmax."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # GQA: [T, heads, D]
    v = v.repeat_interleave(groups, dim=1)
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, T, D]
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])  # [heads, T, T]
    causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1).to(v.dtype)
    return (probs @ v).transpose(0, 1).flatten(1)  # [T, heads*D]


def mlp(x, w, prefix):
    gate = x @ w[prefix + "gate_proj.weight"].T
    return (F.silu(gate) * (x @ w[prefix + "up_proj.weight"].T)) @ w[prefix + "down_proj.weight"].T


def as_id_list(request_ids):
    if torch.is_tensor(request_ids):
        return [int(r) for r in request_ids.reshape(-1).tolist()]
    return [int(r) for r in request_ids]


class Engine:
    def __init__(self, model_config, weight_dir, device):
        self.device = torch.device(device)
        self.num_layers = model_config["num_hidden_layers"]
        self.num_heads = model_config["num_attention_heads"]
        self.num_kv_heads = model_config["num_key_value_heads"]
        self.head_dim = model_config["head_dim"]
        self.eps = float(model_config.get("rms_norm_eps") or 1e-5)
        self.rope_theta = float(model_config.get("rope_theta") or 10000.0)
        self.w = load_weights(weight_dir, self.device, compute_dtype(model_config, device))
        self.tokens = {}  # request id -> every token so far, 1-D long on the device

    def last_logits(self, tokens):
        """Logits [vocab] of the last token, recomputing the whole sequence."""
        w, n = self.w, tokens.shape[0]
        x = w["embed_tokens.weight"][tokens]  # [T, hidden]
        for i in range(self.num_layers):
            p = f"layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], self.eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, self.num_heads, self.head_dim)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, self.num_kv_heads, self.head_dim)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, self.num_kv_heads, self.head_dim)
            q, k = apply_rope(q, self.rope_theta), apply_rope(k, self.rope_theta)
            x = x + causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T
            x = x + mlp(rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps), w, p + "mlp.")
        last = rms_norm(x[-1], w["norm.weight"], self.eps)  # only the last token's logits are asked for
        return last @ w["lm_head.weight"].T

    @torch.no_grad()
    def prefill(self, request_ids, input_ids):
        rows = []
        for rid, tokens in zip(as_id_list(request_ids), input_ids):
            self.tokens[rid] = tokens.reshape(-1).to(self.device, torch.long)  # replaces any old state
            rows.append(self.last_logits(self.tokens[rid]))
        return torch.stack(rows)  # [B, vocab]

    @torch.no_grad()
    def decode(self, request_ids, token_ids):
        rows = []
        for rid, token in zip(as_id_list(request_ids), token_ids.reshape(-1, 1).to(self.device, torch.long)):
            self.tokens[rid] = torch.cat((self.tokens[rid], token))
            rows.append(self.last_logits(self.tokens[rid]))
        return torch.stack(rows)  # [B, vocab]

    def remove(self, request_ids):
        for rid in as_id_list(request_ids):
            self.tokens.pop(rid, None)


def create_engine(model_config: dict, weight_dir: str, device: str = "cuda"):
    return Engine(model_config, weight_dir, device)
