"""The reference model, with the contract's math to the letter.

It runs one request's whole history at batch size 1, like the public evaluator's: slow,
obviously right, and the thing every logit is compared with. It computes with the weights
in the contract's layout (contract.checkpoint reads either format into it), plus what the
Hugging Face families add: q/k/v biases (Qwen2), an RMSNorm over each head of q and k
before RoPE (Qwen3), llama3 RoPE frequencies (Llama 3), mixture-of-experts MLPs routed in
fp32 (Qwen3-MoE); tests/test_hf.py and tests/test_moe.py hold it to `transformers`' own models.
"""
import math

import torch

from contract.model_config import ModelConfig


class ReferenceModel:
    def __init__(self, config: ModelConfig, weights: dict, device: str, dtype=None):
        """`dtype`: the compute dtype, the config's rule on `device` unless given."""
        self.config = config
        self.device = device
        self.dtype = dtype or config.compute_dtype(device)
        self.w = {name: t.to(device=device, dtype=self.dtype) for name, t in weights.items()}
        self.routing = None  # a list while routing is recorded: each sparse layer's router logits [T, E]
        self.flips = {}  # layer -> positions whose k-th expert is swapped for the (k+1)-th

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32, cast back, *then* multiply by the weight.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return xf.to(self.dtype) * weight

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        """Interleaved pairs (x[2i], x[2i+1]) rotated by position * inv_freq[i]."""
        _, seq_len, _, head_dim = x.shape
        exponent = torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim
        inv_freq = 1.0 / (self.config.rope_theta ** exponent)
        if self.config.rope_scaling is not None:
            inv_freq = llama3_frequencies(inv_freq, self.config.rope_scaling)
        angles = torch.outer(torch.arange(seq_len, device=x.device, dtype=torch.float32), inv_freq)
        cos = angles.cos().to(self.dtype)[None, :, None, :]  # [1, T, 1, head_dim/2]
        sin = angles.sin().to(self.dtype)[None, :, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)  # [B, T, H, D/2, 2]
        return out.flatten(-2)

    def attention(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        c, w = self.config, self.w
        p = f"layers.{layer}.self_attn."
        batch, seq_len, _ = x.shape
        q, k, v = (self.linear(x, p + name) for name in ("q_proj", "k_proj", "v_proj"))
        q = q.view(batch, seq_len, c.num_attention_heads, c.head_dim)
        k = k.view(batch, seq_len, c.num_key_value_heads, c.head_dim)
        v = v.view(batch, seq_len, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:  # over each head's head_dim, before RoPE
            q, k = self.rms_norm(q, w[p + "q_norm.weight"]), self.rms_norm(k, w[p + "k_norm.weight"])
        q, k = self.rope(q), self.rope(k)
        groups = c.num_attention_heads // c.num_key_value_heads
        k = k.repeat_interleave(groups, dim=2)
        v = v.repeat_interleave(groups, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(c.head_dim)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(self.dtype)
        out = (probs @ v).transpose(1, 2).reshape(batch, seq_len, -1)  # [B, T, H*D]
        return out @ w[p + "o_proj.weight"].T

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W^T, plus the bias when the config has one there (q, k, v of Qwen2)."""
        out = x @ self.w[name + ".weight"].T
        return out + self.w[name + ".bias"] if name + ".bias" in self.w else out

    def mlp(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        p = f"layers.{layer}.mlp."
        gate = x @ self.w[p + "gate_proj.weight"].T
        up = x @ self.w[p + "up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ self.w[p + "down_proj.weight"].T

    def route(self, x: torch.Tensor, layer: int) -> tuple:
        """(weights [N, k] in the compute dtype, experts [N, k], router logits [N, E] in fp32) for
        x [N, hidden]: softmax over every expert in fp32, the top k, renormalised to sum to 1
        when the config says so (transformers' Qwen3MoeTopKRouter). At the positions `flips`
        names for this layer, the (k+1)-th expert in place of the k-th: where the two tie
        within rounding, what an engine may pick (fitness.reference_logits)."""
        k = self.config.num_experts_per_tok
        logits = x @ self.w[f"layers.{layer}.mlp.gate.weight"].T  # [N, E], in the compute dtype
        probs = torch.softmax(logits.float(), dim=-1)
        top, experts = torch.topk(probs, min(k + 1, probs.shape[-1]), dim=-1)  # and the (k+1)-th, for a flip
        flipped = self.flips.get(layer, [])  # positions routed to the (k+1)-th in place of the k-th
        top[flipped, k - 1], experts[flipped, k - 1] = top[flipped, k], experts[flipped, k]
        top, experts = top[:, :k], experts[:, :k]
        if self.config.norm_topk_prob:
            top = top / top.sum(-1, keepdim=True)
        return top.to(self.dtype), experts, logits.float()

    def moe(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """A sparse layer's MLP: each token's chosen experts' SwiGLU, weighted by the router and summed."""
        flat = x.reshape(-1, x.shape[-1])  # [N, hidden]
        weights, experts, logits = self.route(flat, layer)
        if self.routing is not None:
            self.routing.append(logits)
        out = torch.zeros_like(flat)
        for e in experts.unique().tolist():
            rows, slot = torch.where(experts == e)  # the tokens that chose e, and where in their top k
            p = f"layers.{layer}.mlp.experts.{e}."
            hidden = torch.nn.functional.silu(flat[rows] @ self.w[p + "gate_proj.weight"].T) \
                * (flat[rows] @ self.w[p + "up_proj.weight"].T)
            out.index_add_(0, rows, (hidden @ self.w[p + "down_proj.weight"].T) * weights[rows, slot, None])
        return out.view(x.shape)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions=None) -> torch.Tensor:
        """Logits [T, vocab] of one whole sequence (a 1-D tensor of token ids), or only at
        `positions` [len(positions), vocab]: attention is causal, so position p's logits
        are those of the sequence's first p + 1 tokens alone."""
        w = self.w
        x = w["embed_tokens.weight"][tokens.to(self.device)][None]  # [1, T, hidden]
        for i in range(self.config.num_hidden_layers):
            x = x + self.attention(self.rms_norm(x, w[f"layers.{i}.input_layernorm.weight"]), i)
            h = self.rms_norm(x, w[f"layers.{i}.post_attention_layernorm.weight"])
            x = x + (self.moe(h, i) if self.config.is_sparse_layer(i) else self.mlp(h, i))
        if positions is not None:
            x = x[:, list(positions)]
        x = self.rms_norm(x, w["norm.weight"])
        return (x @ w["lm_head.weight"].T)[0]

    def last_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [vocab] of the last token, recomputing the whole history."""
        return self.forward(tokens)[-1]


def llama3_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3's rule: frequencies whose wavelength exceeds the original context divided by
    low_freq_factor are slowed by `factor`, those under it divided by high_freq_factor are
    kept, and those between are blended smoothly (transformers' _compute_llama3_parameters)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > context / low, inv_freq / factor, blended)
    return torch.where(wavelength < context / high, inv_freq, scaled)
