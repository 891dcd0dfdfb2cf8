"""The reference model, with the contract's math to the letter.

It runs one request's whole history at batch size 1, like the public evaluator's: slow,
obviously right, and the thing every logit is compared with. It computes with the weights
in the contract's layout (contract.checkpoint reads either format into it), plus what the
Hugging Face families add: q/k/v biases (Qwen2), an RMSNorm over each head of q and k
before RoPE (Qwen3), llama3 RoPE frequencies (Llama 3), mixture-of-experts MLPs routed in
fp32 (Qwen3-MoE), and Qwen3.5's hybrid: Gated DeltaNet layers run token by token in fp32,
attention gated and rotated in part, a shared expert, zero-centred norms. tests/test_hf.py,
tests/test_moe.py and tests/test_hybrid.py hold it to `transformers`' own models.
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
        # Normalise in fp32, cast back, *then* multiply by the weight; a zero-centred norm
        # (Qwen3.5) scales by 1 + weight in fp32 and casts last.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        if self.config.zero_centred_norm:
            return (xf * (1 + weight.float())).to(self.dtype)
        return xf.to(self.dtype) * weight

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        """Interleaved pairs (x[2i], x[2i+1]) rotated by position * inv_freq[i], over each
        head's first rotary_dim dimensions (all of them but in Qwen3.5); the rest as they are."""
        seq_len, rotary = x.shape[1], self.config.rotary_dim
        x, unturned = x[..., :rotary], x[..., rotary:]
        exponent = torch.arange(0, rotary, 2, device=x.device, dtype=torch.float32) / rotary
        inv_freq = 1.0 / (self.config.rope_theta ** exponent)
        if self.config.rope_scaling is not None:
            inv_freq = llama3_frequencies(inv_freq, self.config.rope_scaling)
        angles = torch.outer(torch.arange(seq_len, device=x.device, dtype=torch.float32), inv_freq)
        cos = angles.cos().to(self.dtype)[None, :, None, :]  # [1, T, 1, head_dim/2]
        sin = angles.sin().to(self.dtype)[None, :, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)  # [B, T, H, rotary/2, 2]
        return torch.cat((out.flatten(-2), unturned), dim=-1)

    def attention(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        c, w = self.config, self.w
        p = f"layers.{layer}.self_attn."
        batch, seq_len, _ = x.shape
        q, k, v = (self.linear(x, p + name) for name in ("q_proj", "k_proj", "v_proj"))
        if c.attn_output_gate:  # each head's query, then its gate (Qwen3.5)
            q, gate = q.view(batch, seq_len, c.num_attention_heads, 2, c.head_dim).unbind(3)
        q = q.reshape(batch, seq_len, c.num_attention_heads, c.head_dim)
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
        if c.attn_output_gate:
            out = out * torch.sigmoid(gate.reshape(batch, seq_len, -1))
        return out @ w[p + "o_proj.weight"].T

    def gated_delta_net(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """A Gated DeltaNet layer (Qwen3.5) over x [1, T, hidden], as transformers'
        Qwen3_5MoeGatedDeltaNet computes it: q, k, v through a causal depthwise conv and SiLU;
        then, per value head, token by token in fp32, a state S [key dim, value dim] decays by
        exp(g), learns v's part that S k does not predict (the delta rule, rate beta), and is
        read by q; each head's output RMS-normed, times silu(z)."""
        c, p = self.config, f"layers.{layer}.linear_attn."
        w = {name[len(p):]: t for name, t in self.w.items() if name.startswith(p)}
        seq_len, kernel = x.shape[1], c.linear_conv_kernel_dim
        mixed = (x[0] @ w["in_proj_qkv.weight"].T).T[None]  # [1, conv_dim, T]
        conv = torch.nn.functional.conv1d(mixed, w["conv1d.weight"], padding=kernel - 1, groups=mixed.shape[1])
        mixed = torch.nn.functional.silu(conv[0, :, :seq_len]).T  # [T, conv_dim]
        key_dim = c.linear_num_key_heads * c.linear_key_head_dim
        q, k, v = mixed.split((key_dim, key_dim, mixed.shape[1] - 2 * key_dim), dim=-1)
        heads, repeat = c.linear_num_value_heads, c.linear_num_value_heads // c.linear_num_key_heads
        # Each q/k head serves `repeat` consecutive value heads; fp32, unit length, q scaled.
        q, k = (l2_normalised(t.float().view(seq_len, c.linear_num_key_heads, -1)).repeat_interleave(repeat, 1)
                for t in (q, k))
        q = q / math.sqrt(c.linear_key_head_dim)
        v = v.float().view(seq_len, heads, c.linear_value_head_dim)
        beta = torch.sigmoid(x[0] @ w["in_proj_b.weight"].T).float()  # [T, heads]
        a = (x[0] @ w["in_proj_a.weight"].T).float()
        decay = torch.exp(-w["A_log"].float().exp() * torch.nn.functional.softplus(a + w["dt_bias"]))
        state = torch.zeros(heads, c.linear_key_head_dim, c.linear_value_head_dim, device=x.device)
        out = torch.empty_like(v)
        for t in range(seq_len):
            state = state * decay[t, :, None, None]
            predicted = torch.einsum("hk,hkv->hv", k[t], state)
            state = state + torch.einsum("hk,hv->hkv", k[t], (v[t] - predicted) * beta[t, :, None])
            out[t] = torch.einsum("hk,hkv->hv", q[t], state)
        z = (x[0] @ w["in_proj_z.weight"].T).view(seq_len, heads, -1)
        out = out.to(self.dtype).float()  # as transformers' kernel hands it to the norm
        normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)
        gated = (w["norm.weight"] * normed.to(self.dtype)) * torch.nn.functional.silu(z.float())
        return (gated.to(self.dtype).reshape(1, seq_len, -1)) @ w["out_proj.weight"].T

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W^T, plus the bias when the config has one there (q, k, v of Qwen2)."""
        out = x @ self.w[name + ".weight"].T
        return out + self.w[name + ".bias"] if name + ".bias" in self.w else out

    def mlp(self, x: torch.Tensor, layer: int, prefix: str = None) -> torch.Tensor:
        """The SwiGLU of layer `layer`'s MLP (or of the one under `prefix`: a shared expert)."""
        p = prefix or f"layers.{layer}.mlp."
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
        if self.config.shared_expert_intermediate_size:  # every token's, behind a sigmoid gate (Qwen3.5)
            p = f"layers.{layer}.mlp.shared_expert"
            shared = self.mlp(flat, layer, p + ".")
            out = out + torch.sigmoid(flat @ self.w[p + "_gate.weight"].T) * shared
        return out.view(x.shape)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions=None) -> torch.Tensor:
        """Logits [T, vocab] of one whole sequence (a 1-D tensor of token ids), or only at
        `positions` [len(positions), vocab]: attention is causal, so position p's logits
        are those of the sequence's first p + 1 tokens alone."""
        w = self.w
        x = w["embed_tokens.weight"][tokens.to(self.device)][None]  # [1, T, hidden]
        for i in range(self.config.num_hidden_layers):
            mix = self.gated_delta_net if self.config.is_linear_layer(i) else self.attention
            x = x + mix(self.rms_norm(x, w[f"layers.{i}.input_layernorm.weight"]), i)
            h = self.rms_norm(x, w[f"layers.{i}.post_attention_layernorm.weight"])
            x = x + (self.moe(h, i) if self.config.is_sparse_layer(i) else self.mlp(h, i))
        if positions is not None:
            x = x[:, list(positions)]
        x = self.rms_norm(x, w["norm.weight"])
        return (x @ w["lm_head.weight"].T)[0]

    def last_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [vocab] of the last token, recomputing the whole history."""
        return self.forward(tokens)[-1]


def l2_normalised(x: torch.Tensor) -> torch.Tensor:
    """x over its length along the last dimension (eps 1e-6 inside the root, as FLA's and transformers')."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


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
