"""Prefill and decode both captured in CUDA graphs, for bucketed sizes, all inside create_engine.

A prefill is host-bound without graphs: one call launches a few hundred kernels from
Python for well under a millisecond of GPU work (issue 8: 6.3 ms of wall time for 0.49 ms
of GPU). Here a prefill of N packed tokens from at most MAX_PREFILL_PROMPTS prompts
replays the graph of the smallest token bucket >= N: its tokens, positions and cache rows
fill the first N rows of static buffers, the padding rows after them write to the cache's
scratch row 0 (owned by no request) and belong to no prompt, so no prompt attends to them;
the varlen attention reads each prompt's start and length from static device buffers
(padding prompts have length 0) over a grid fixed by the bucket. Logits are taken at each
prompt's last row inside the graph. Decode works as in `cuda_graphs`: batch buckets.

Larger prefills, more prompts, bigger decode batches and bf16 prefills (whose attention
falls back to a per-prompt loop) run eagerly. One memory pool serves every graph, captured
largest first. When the cache grows, its tensors move, and every graph is captured again.
"""
import array

import torch

# Allowed alleles in order of preference (a swap repairs to the first): the chunked pool and
# the split-KV kernel were the fastest on an H100/H200 and the chunked pool the smallest.
REQUIRES = {"KVCache": ("paged_chunks", "paged", "slab"), "attend_decode": ("triton_split_kv", "table_sdpa"),
            "attend_prefill": ("triton_varlen",)}
DEVICES = "cuda"

MAX_PREFILL_TOKENS = 2048  # range: 256..16384; the most packed tokens a captured prefill takes
MAX_PREFILL_PROMPTS = 16  # range: 4..64; the most prompts a captured prefill takes


def token_buckets(largest):
    """Token counts with a prefill graph: 16, 24, 32, 48, 64, ... (powers of two and the
    halfway points between them), then `largest`: a call computes at most 1.5x its tokens."""
    sizes, size = set(), 16
    while size < largest:
        sizes |= {size, size + size // 2}
        size *= 2
    return sorted({s for s in sizes if s < largest} | {largest})


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
        self.buckets = {"decode": graph_buckets(MAX_GRAPH_BATCH), "prefill": token_buckets(MAX_PREFILL_TOKENS)}
        if self.dtype == torch.bfloat16:
            self.buckets["prefill"] = []  # its attention loops over prompts on the host: not capturable
        rows, prompts = max(MAX_GRAPH_BATCH, MAX_PREFILL_TOKENS), MAX_PREFILL_PROMPTS
        # Host metadata goes to the device in few copies: a decode's positions and slots in
        # one, a prefill's positions, then each prompt's start, length and last row. Zeros
        # address the cache's scratch row 0 and position 0: harmless padding.
        self.meta = torch.zeros(2 * rows + 3 * prompts, dtype=torch.long, device=self.device)
        self.static = {
            "tokens": torch.zeros(rows, dtype=torch.long, device=self.device),
            "positions": self.meta[:rows],
            "slots": self.meta[rows:2 * rows],
            "block_table": torch.zeros(MAX_GRAPH_BATCH, self.cache.max_pages, dtype=torch.long,
                                       device=self.device),
            "starts": self.meta[2 * rows:2 * rows + prompts],
            "lengths": self.meta[2 * rows + prompts:2 * rows + 2 * prompts],
            "last": self.meta[2 * rows + 2 * prompts:],
        }
        self.positions_slots = self.meta[:2 * rows].view(2, rows)  # a decode's one copy goes here
        self.graphs, self.graph_logits, self.graph_pool = {}, {}, None
        self.capture_graphs()

    @torch.no_grad()
    def capture_graphs(self):
        """One graph per bucket of each kind, largest first, sharing one memory pool; none
        on CPU (`run_static` then runs the same static-buffer forward eagerly)."""
        self.graphs, self.graph_logits, self.graph_pool = {}, {}, None
        self.captured_generation = self.cache.generation
        for buffer in self.static.values():  # on CPU too, so that its tests see what a GPU does
            buffer.zero_()  # capture computes on padding rows only: it touches scratch alone
        if self.device.type != "cuda":
            return
        keys = [(kind, size) for kind, sizes in self.buckets.items() for size in sizes]
        for key in sorted(keys, key=lambda k: -k[1]):
            self.graph_logits[key] = self.forward_static(*key)  # warm-up: JIT, lazy state
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                self.graph_logits[key] = self.forward_static(*key)
            self.graph_pool = graph.pool() if self.graph_pool is None else self.graph_pool
            self.graphs[key] = graph
        torch.cuda.synchronize(self.device)

    def prepare_static(self, step, fill):
        """cache.prepare(step), with `fill()` (the call's host metadata into the static
        buffers) before it, as a slab's prepare reads the positions."""
        fill()
        self.cache.prepare(step)
        self.recapture_if_moved(fill)

    def recapture_if_moved(self, fill):
        """The graphs captured again if the cache grew (now or in an eager call: its tensors
        moved), and `fill()` again: a capture zeroes every static buffer."""
        if self.cache.generation != self.captured_generation:
            self.capture_graphs()
            fill()

    def run_static(self, kind, size, rows):
        """The first `rows` logits of the graph of (kind, size), over the filled static buffers."""
        if (kind, size) in self.graphs:
            self.graphs[(kind, size)].replay()
            logits = self.graph_logits[(kind, size)]
        else:
            logits = self.forward_static(kind, size)
        return logits[:rows].clone()  # the next replay overwrites the static logits

    @torch.no_grad()
    def prefill(self, request_ids, input_ids):
        ids = as_id_list(request_ids)
        lengths = [int(t.numel()) for t in input_ids]
        total = sum(lengths)
        size = next((b for b in self.buckets["prefill"] if b >= total), None)
        tokens = torch.cat([t.reshape(-1) for t in input_ids]).to(self.device, torch.long)
        positions = [p for n in lengths for p in range(n)]
        if size is None or len(ids) > MAX_PREFILL_PROMPTS:  # eager: larger than any graph
            positions = torch.tensor(positions, device=self.device)
            return self.forward(tokens, Step(ids, [0] * len(ids), lengths, positions, False))
        starts = [0]
        for n in lengths[:-1]:
            starts.append(starts[-1] + n)
        padding = [0] * (MAX_PREFILL_PROMPTS - len(ids))
        rows = self.static["positions"].shape[0]
        prompts = starts + padding, lengths + padding, [a + n - 1 for a, n in zip(starts, lengths)] + padding
        host = torch.tensor(positions + [0] * (size - total)), torch.tensor(sum(prompts, []))

        def fill():
            self.meta[:size].copy_(host[0], non_blocking=True)
            self.meta[2 * rows:].copy_(host[1], non_blocking=True)

        s = self.static
        step = Step(ids, [0] * len(ids), lengths, s["positions"][:total], False)
        self.prepare_static(step, fill)
        s["tokens"][:total] = tokens
        s["slots"][:total] = step.slots
        s["slots"][total:size].zero_()  # padding rows write to the scratch row
        return self.run_static("prefill", size, len(ids))

    @torch.no_grad()
    def decode(self, request_ids, token_ids):
        ids = as_id_list(request_ids)
        start = [self.cache.length(rid) for rid in ids]
        size = next((b for b in self.buckets["decode"] if b >= len(ids)), None)
        if size is None:  # eager: more requests than the largest graph
            step = Step(ids, start, [1] * len(ids), torch.tensor(start, device=self.device), True)
            return self.forward(token_ids.reshape(-1).to(self.device, torch.long), step)
        s, batch = self.static, len(ids)
        # Three copies and no torch op on the host: every call is host-bound at this size.
        # Padding rows get position 0, the scratch row and a block table of scratch pages
        # (columns past `width` are stale, and no position reaches them).
        slots, tables = self.cache.decode_addresses(Step(ids, start, [1] * batch, None, True))
        padding = [0] * (size - batch)
        width = max(len(t) for t in tables)
        # One flat stdlib array viewed by torch: torch.tensor on nested lists took ~250 us of
        # host time at a batch of 64, this ~60 us (on a core of the 2-core CI machine).
        flat = start + padding + slots + padding
        for t in tables:
            flat += t
            flat += [0] * (width - len(t))
        flat += [0] * (width * len(padding))
        flat = torch.frombuffer(array.array("q", flat), dtype=torch.long)
        host, table = flat[:2 * size].view(2, size), flat[2 * size:].view(size, width)  # positions, slots; pages
        tokens = token_ids.reshape(-1)

        def fill():
            self.positions_slots[:, :size].copy_(host, non_blocking=True)
            s["block_table"][:size, :width].copy_(table, non_blocking=True)
            s["tokens"][:batch].copy_(tokens, non_blocking=True)

        fill()
        self.recapture_if_moved(fill)
        return self.run_static("decode", size, batch)

    def remove(self, request_ids):
        self.cache.remove(as_id_list(request_ids))

    def forward_static(self, kind, size):
        """Logits of the static buffers' first `size` rows: one per row for a decode, one
        per prompt (MAX_PREFILL_PROMPTS, padding included) for a prefill."""
        s = self.static
        if kind == "decode":
            step = Step([], [], [1] * size, s["positions"][:size], True, s["slots"][:size],
                        s["block_table"][:size])
            x = self.hidden_states(s["tokens"][:size], step)
        else:
            step = Step([], [], [], s["positions"][:size], False, s["slots"][:size])
            # Read by the varlen attention instead of the host's num_new (see its allele).
            step.prompt_starts, step.prompt_lengths = s["starts"], s["lengths"]
            x = self.hidden_states(s["tokens"][:size], step)[s["last"]]
        return rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T

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
