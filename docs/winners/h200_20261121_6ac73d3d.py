"""Seed engine: the simplest correct KV-cached engine, written in gene form.

Each concern is one top-level name (a gene) that a rewrite can find and swap:
  compute_dtype   the reference's dtype rule
  load_weights    weight layout on the device
  rms_norm        normalisation
  add_rms_norm    residual add, then normalisation (one boundary, so a kernel can fuse them)
  rope_tables     cos/sin for the positions of one call
  apply_rope      interleaved-pair rotation
  qkv_proj        q, k, v projections
  mlp             SwiGLU
  KVCache         where K/V live: one tensor per request and layer
  attend_prefill  prompt attention, one request at a time
  attend_decode   one-token attention: gather, pad, mask
  Engine          batching: every call's tokens go through one packed forward pass
  create_engine   the contract's entry point

Every size comes from the config or the weights; imports are stdlib and torch only.
"""
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def compute_dtype(model_config, device):
    """fp32 on CPU; on CUDA bf16 when the config asks for it, otherwise fp16."""
    if not str(device).startswith("cuda"):
        return torch.float32
    name = str(model_config.get("torch_dtype", "float16")).lower()
    return torch.bfloat16 if name in ("bfloat16", "bf16") else torch.float16


# allele: fused_gate_up
def load_weights(model_config, weight_dir, device, dtype):
    """The checkpoint on the device in the compute dtype; per layer, "gate_up" holds the gate
    rows then the up rows."""
    raw = torch.load(os.path.join(weight_dir, "model.pt"), map_location="cpu", weights_only=True)

    def get(name):
        return raw[name].to(device=device, dtype=dtype)

    layers = []
    for i in range(model_config["num_hidden_layers"]):
        p = f"layers.{i}."
        layers.append({
            "input_norm": get(p + "input_layernorm.weight"),
            "q": get(p + "self_attn.q_proj.weight"),
            "k": get(p + "self_attn.k_proj.weight"),
            "v": get(p + "self_attn.v_proj.weight"),
            "o": get(p + "self_attn.o_proj.weight"),
            "post_norm": get(p + "post_attention_layernorm.weight"),
            "gate_up": torch.cat((raw[p + "mlp.gate_proj.weight"], raw[p + "mlp.up_proj.weight"]))
                            .to(device=device, dtype=dtype),  # [2*intermediate, hidden]
            "down": get(p + "mlp.down_proj.weight"),
        })
    return {"embed": get("embed_tokens.weight"), "layers": layers,
            "norm": get("norm.weight"), "lm_head": get("lm_head.weight")}


def rms_norm(x, weight, eps):
    # Normalise in fp32, cast back, then scale: the reference's order of rounding.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) * weight


def add_rms_norm(x, residual, weight, eps):
    """(rms_norm(x + residual), x + residual): the sum is the new residual stream."""
    x = x + residual
    return rms_norm(x, weight, eps), x


def rope_tables(positions, head_dim, theta, dtype):
    """cos and sin [N, head_dim/2] for absolute positions [N], computed in fp32."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponent)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [N, head_dim/2]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin):
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x [N, heads, head_dim]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]  # [N, heads, head_dim/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def qkv_proj(x, layer):
    """q [N, heads*head_dim], k and v [N, kv_heads*head_dim] from x [N, hidden]."""
    return x @ layer["q"].T, x @ layer["k"].T, x @ layer["v"].T


# allele: fused
def mlp(x, layer):
    # One launch and one read of x for gate and up; chunk gives views, no copies.
    gate, up = (x @ layer["gate_up"].T).chunk(2, dim=-1)  # [N, intermediate] each
    return (F.silu(gate) * up) @ layer["down"].T


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

SLAB_SLOTS = 16  # range: 4..256; slots allocated up front (slot 0 is scratch)


# allele: slab
class KVCache:
    """K/V in one slab per layer, [slots, max_positions, kv_heads, head_dim]; a slot per request."""

    def __init__(self, model_config, device, dtype):
        self.num_layers = model_config["num_hidden_layers"]
        self.max_positions = int(model_config.get("max_position_embeddings") or 4096)
        self.page_size, self.max_pages = self.max_positions, 1  # the slab as one page per request
        self.row_shape = (model_config["num_key_value_heads"], model_config["head_dim"])
        self.device, self.dtype = device, dtype
        self.slot_of, self.lengths, self.free = {}, {}, []
        self.k, self.v = [], []
        self.generation = -1
        self.grow(SLAB_SLOTS)

    def grow(self, num_slots):
        """Reallocate every layer's slab with `num_slots` slots, keeping what it holds."""
        old = self.k[0].shape[0] if self.k else 0
        shape = (num_slots, self.max_positions, *self.row_shape)

        def grown(t):
            # Zeros, not empty: a masked SDPA multiplies stale rows by 0, and 0 * NaN is NaN.
            new = torch.zeros(shape, device=self.device, dtype=self.dtype)
            if t is not None:
                new[:old] = t
            return new

        self.k = [grown(self.k[i] if old else None) for i in range(self.num_layers)]
        self.v = [grown(self.v[i] if old else None) for i in range(self.num_layers)]
        self.free += range(num_slots - 1, max(old, 1) - 1, -1)  # popped lowest first
        self.generation += 1

    def length(self, request_id):
        return self.lengths[request_id]

    def take_slot(self):
        if not self.free:
            self.grow(2 * self.k[0].shape[0])
        return self.free.pop()

    def prepare(self, step):
        """Give new requests a slot, count the tokens this step adds, and address them."""
        for rid, n in zip(step.request_ids, step.num_new):
            total = n if not step.is_decode else self.lengths[rid] + n
            if total > self.max_positions:
                raise ValueError(f"request {rid} would hold {total} tokens, more than "
                                 f"max_position_embeddings={self.max_positions}")
            if rid not in self.slot_of:  # a prefill of a live id keeps its slot and replaces its K/V
                self.slot_of[rid] = self.take_slot()
            self.lengths[rid] = total
        slots = torch.tensor([self.slot_of[rid] for rid in step.request_ids])
        rows = slots.repeat_interleave(torch.tensor(step.num_new)) * self.max_positions  # [N] slot bases
        step.block_table = slots.to(self.device)[:, None]  # [B, 1]
        step.slots = rows.to(self.device) + step.positions  # [N] flat row of every new token

    def write(self, layer, step, k, v):
        """Store packed k, v [N, kv_heads, head_dim] at the rows `prepare` chose."""
        self.k[layer].view(-1, *self.row_shape)[step.slots] = k  # flat view: [slots*max_positions, ...]
        self.v[layer].view(-1, *self.row_shape)[step.slots] = v

    def read(self, layer, request_id):
        slot, n = self.slot_of[request_id], self.lengths[request_id]
        return self.k[layer][slot, :n], self.v[layer][slot, :n]

    def remove(self, request_ids):
        for rid in request_ids:
            slot = self.slot_of.pop(rid, None)
            if slot is not None:
                self.free.append(slot)
                del self.lengths[rid]


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


def per_request_attention(q, k, v, num_new):
    """Causal attention over each packed prompt alone: q [N, heads, D] -> [N, heads*D]."""
    outs = []
    for q_r, k_r, v_r in zip(q.split(num_new), k.split(num_new), v.split(num_new)):
        out = sdpa(q_r.transpose(0, 1)[None], k_r.transpose(0, 1)[None], v_r.transpose(0, 1)[None],
                   is_causal=True)  # [1, heads, t, D]
        outs.append(out[0].transpose(0, 1).flatten(1))  # [t, heads*D]
    return torch.cat(outs)


# allele: sdpa_per_request
def attend_prefill(q, k, v, cache, layer, step):
    """Causal attention over each prompt alone: q [N, heads, D] -> [N, heads*D]."""
    return per_request_attention(q, k, v, step.num_new)


def sdpa(q, k, v, attn_mask=None, is_causal=False):
    """F.scaled_dot_product_attention (GQA allowed), except in bf16.

    Fused kernels keep the probabilities in fp32 through @ v; the reference rounds them to
    the compute dtype first. In fp16 that is rounding noise (under half the tolerance on an
    H200); in bf16 it misses the reference by 1.7-2.8x the tolerance even with the
    contract's 0.02 weights (docs/PERF.md), so bf16 takes the reference's math.
    """
    if q.dtype != torch.bfloat16:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                              enable_gqa=True)
    if is_causal:
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    elif attn_mask is None:
        attn_mask = torch.ones(1, dtype=torch.bool, device=q.device)
    return masked_attention(q, k, v, attn_mask)


def table_attention(q, cache, layer, step):
    """Decode attention over the pages of each request's block table, masked past its
    position: q [B, heads, D] -> [B, heads*D]. Static shapes, so it captures in a graph."""
    keys = cache.k[layer][step.block_table].flatten(1, 2)  # [B, pages*page_size, kv_heads, D]
    values = cache.v[layer][step.block_table].flatten(1, 2)
    # The new token sits at `positions`; everything after it is another request's or stale.
    valid = torch.arange(keys.shape[1], device=q.device)[None, :] <= step.positions[:, None]  # [B, L]
    out = sdpa(q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2),
               attn_mask=valid[:, None, None, :])  # [B, heads, 1, D]
    return out.flatten(1)


# allele: table_sdpa
def attend_decode(q, k, v, cache, layer, step):
    """Each request's one query over the pages of its block table: q [B, heads, D] -> [B, heads*D]."""
    return table_attention(q, cache, layer, step)


def as_id_list(request_ids):
    if torch.is_tensor(request_ids):
        return [int(r) for r in request_ids.reshape(-1).tolist()]
    return [int(r) for r in request_ids]

MAX_GRAPH_BATCH = 64  # range: 8..256; the largest batch a graph is captured for


def graph_buckets(largest):
    """Batch sizes with a graph: 1, 2, 4, 8, then every multiple of 16 up to `largest`."""
    return sorted({b for b in (1, 2, 4, 8) if b <= largest} | set(range(16, largest + 1, 16)) | {largest})


# allele: cuda_graphs
class Engine:
    def __init__(self, model_config, weight_dir, device):
        self.device = torch.device(device)
        self.dtype = compute_dtype(model_config, device)
        self.num_heads = model_config["num_attention_heads"]
        self.num_kv_heads = model_config["num_key_value_heads"]
        self.head_dim = model_config["head_dim"]
        self.eps = float(model_config.get("rms_norm_eps") or 1e-5)
        self.rope_theta = float(model_config.get("rope_theta") or 10000.0)
        self.w = load_weights(model_config, weight_dir, self.device, self.dtype)
        self.cache = KVCache(model_config, self.device, self.dtype)
        every_position = torch.arange(self.cache.max_positions, device=self.device)
        self.rope_cos, self.rope_sin = rope_tables(every_position, self.head_dim, self.rope_theta,
                                                   self.dtype)  # [max_positions, head_dim/2]
        self.buckets = graph_buckets(MAX_GRAPH_BATCH)
        largest = self.buckets[-1]
        self.static = {  # zeros address the cache's scratch row 0: harmless padding
            "tokens": torch.zeros(largest, dtype=torch.long, device=self.device),
            "positions": torch.zeros(largest, dtype=torch.long, device=self.device),
            "slots": torch.zeros(largest, dtype=torch.long, device=self.device),
            "block_table": torch.zeros(largest, self.cache.max_pages, dtype=torch.long, device=self.device),
        }
        self.graphs, self.graph_logits, self.graph_pool = {}, {}, None
        self.capture_graphs()

    @torch.no_grad()
    def capture_graphs(self):
        """One graph per bucket, largest first, sharing one memory pool; none on CPU."""
        self.graphs, self.graph_logits, self.graph_pool = {}, {}, None
        self.captured_generation = self.cache.generation
        if self.device.type != "cuda":
            return  # nothing to capture: `replay` runs forward_static eagerly
        for buffer in self.static.values():
            buffer.zero_()  # capture computes on padding rows only: it touches scratch alone
        for size in reversed(self.buckets):
            self.graph_logits[size] = self.forward_static(size)  # warm-up: JIT, lazy state
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                self.graph_logits[size] = self.forward_static(size)
            self.graph_pool = graph.pool() if self.graph_pool is None else self.graph_pool
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)

    def replay(self, size, tokens, step):
        """Logits [B, vocab] of a prepared decode step through the graph of bucket `size`."""
        batch, width = step.block_table.shape
        s = self.static
        for name in ("tokens", "positions", "slots", "block_table"):
            s[name][:size].zero_()  # padding rows -> scratch row 0, position 0
        s["tokens"][:batch] = tokens
        s["positions"][:batch] = step.positions
        s["slots"][:batch] = step.slots
        s["block_table"][:batch, :width] = step.block_table
        if size in self.graphs:
            self.graphs[size].replay()
            logits = self.graph_logits[size]
        else:
            logits = self.forward_static(size)
        return logits[:batch].clone()  # the next replay overwrites the static logits

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
        step = Step(ids, start, [1] * len(ids), positions, True)
        size = next((b for b in self.buckets if b >= len(ids)), None)
        if size is None:
            return self.forward(tokens, step)  # eager: more requests than the largest graph
        self.cache.prepare(step)
        if self.cache.generation != self.captured_generation:
            self.capture_graphs()  # the cache grew: its tensors moved under the graphs
        return self.replay(size, tokens, step)

    def remove(self, request_ids):
        self.cache.remove(as_id_list(request_ids))

    def forward_static(self, size):
        """Decode logits [size, vocab] of the static buffers' first `size` rows."""
        s = self.static
        step = Step([], [], [1] * size, s["positions"][:size], True, s["slots"][:size],
                    s["block_table"][:size])
        x = self.hidden_states(s["tokens"][:size], step)
        return rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T  # one token per row

    def hidden_states(self, tokens, step):
        """The residual stream [N, hidden] after every layer, for a prepared step."""
        n = tokens.shape[0]
        cos, sin = self.rope_cos[step.positions], self.rope_sin[step.positions]  # [N, head_dim/2]
        attend = attend_decode if step.is_decode else attend_prefill
        x = self.w["embed"][tokens]  # [N, hidden]
        for i, layer in enumerate(self.w["layers"]):
            q, k, v = qkv_proj(rms_norm(x, layer["input_norm"], self.eps), layer)
            q = apply_rope(q.view(n, self.num_heads, self.head_dim), cos, sin)
            k = apply_rope(k.view(n, self.num_kv_heads, self.head_dim), cos, sin)
            v = v.view(n, self.num_kv_heads, self.head_dim)
            self.cache.write(i, step, k, v)
            h, x = add_rms_norm(x, attend(q, k, v, self.cache, i, step) @ layer["o"].T,
                                layer["post_norm"], self.eps)
            x = x + mlp(h, layer)
        return x

    def forward(self, tokens, step):
        """Logits [B, vocab] of the last token of each request in `step` (eager)."""
        self.cache.prepare(step)
        x = self.hidden_states(tokens, step)
        logits = rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T  # [N, vocab]
        last = torch.tensor(step.num_new, device=self.device).cumsum(0) - 1
        return logits[last]


def create_engine(model_config: dict, weight_dir: str, device: str = "cuda"):
    return Engine(model_config, weight_dir, device)
