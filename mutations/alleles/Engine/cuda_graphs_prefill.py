"""Prefill and decode both captured in CUDA graphs, for bucketed sizes, all inside create_engine.

A prefill is host-bound without graphs: one call launches a few hundred kernels from
Python for well under a millisecond of GPU work (one measured: 6.3 ms of wall time for
0.49 ms of GPU). Here a prefill of N packed tokens from at most MAX_PREFILL_PROMPTS prompts
replays the graph of the smallest token bucket >= N: its tokens fill the first N rows of a
static buffer; the host sends only each prompt's start, length, last row and pages, and the
graph's first kernel gives every row its position and cache slot (the host's per-token lists
took ~0.3 ms of a 1.1 ms prefill of 4 x 128 on an H100's host). The padding rows after them
write to the cache's scratch row 0 (owned by no request) and belong to no prompt, so no
prompt attends to them; the varlen attention reads each prompt's start and length from
static device buffers (padding prompts have length 0) over a grid fixed by the bucket.
Logits are taken at each prompt's last row inside the graph. Decode works as in
`cuda_graphs`: batch buckets.

A call's metadata is one host list copied once; every graph is launched once inside
create_engine (a first launch is slower). A step's first kernel gathers its tokens' embeddings
and their positions' RoPE angles (step_inputs). Per layer, the MLP's residual add joins the next
layer's norm, and q and k, when they are views of one fused projection, take one RoPE launch.

Larger prefills, more prompts, bigger decode batches and decodes past GRAPH_MAX_POSITIONS
run eagerly. One memory pool serves every graph, captured largest first. When the
cache grows, its tensors move, and every graph is captured again.
"""
import array
import itertools

import torch
import triton
import triton.language as tl

# Allowed alleles in order of preference (a swap repairs to the first): the chunked pool and
# the split-KV kernel were the fastest on an H100/H200 and the chunked pool the smallest.
REQUIRES = {"KVCache": ("paged_chunks", "paged", "slab"), "attend_decode": ("triton_split_kv", "table_sdpa"),
            "attend_prefill": ("triton_varlen",)}
DEVICES = "cuda"
CANNOT_SERVE = ("delta_net_prefill",)  # the hybrid's DeltaNet prefills run per request (below)

# A run fits the tokens to its largest prefill (`fits:`): on an H100 the long_prompts target's
# 8,192-token prefills ran 3.0-3.7x faster captured than eager, Llama-3.2-1B's 16 x 1,024 2-3%
# (docs/log/2026-11-27-long-prompts-prefills-captured.md). The prompts are not fitted: a captured
# prefill's
# attention grid covers every prompt slot over the whole bucket: at 64 slots and 16,384 tokens
# that prefill ran at 0.29x (docs/log/2026-11-26-llama-20-minute-search.md, before blocks past a
# prompt's end skipped
# their loop; not measured since).
MAX_PREFILL_TOKENS = 2048  # range: 256..16384, fits: prefill_tokens; the most packed tokens a captured prefill takes
MAX_PREFILL_PROMPTS = 16  # range: 4..64; the most prompts a captured prefill takes
# The most tokens one eager forward takes: above the weights, its activations (about 50 KB a
# token on a 1B-class model) are what a large prefill's peak memory is made of.
EAGER_PREFILL_TOKENS = 4096  # range: 512..65536
PREFILL_ROWS_BLOCK = 256  # range: 64..1024; packed tokens a program of the positions/slots kernel fills
PREFILL_ROWS_WARPS = 4  # range: 1..16; warps a program of the positions/slots kernel runs with (Triton's default: 4)
STEP_INPUTS_WARPS = 4  # range: 1..16; warps a program gathering a token's embedding and RoPE rows runs with


@triton.jit
def prefill_rows_kernel(starts_ptr, lengths_ptr, page_starts_ptr, pages_ptr, positions_ptr, slots_ptr,
                        num_rows, page_size, PROMPTS: tl.constexpr, BLOCK: tl.constexpr):
    """Each packed row's position in its prompt and its cache slot (the page its position
    falls in, from the prompt's run of `pages`); rows of no prompt (padding): 0 and 0."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    pos = tl.zeros([BLOCK], dtype=tl.int64) - 1
    first_page = tl.zeros([BLOCK], dtype=tl.int64)
    for p in range(PROMPTS):
        start = tl.load(starts_ptr + p)
        inside = (r >= start) & (r < start + tl.load(lengths_ptr + p))
        pos = tl.where(inside, r - start, pos)
        first_page = tl.where(inside, tl.load(page_starts_ptr + p), first_page)
    valid = pos >= 0
    page = tl.load(pages_ptr + first_page + pos // page_size, mask=valid, other=0)
    ok = r < num_rows
    tl.store(positions_ptr + r, tl.where(valid, pos, 0), mask=ok)
    tl.store(slots_ptr + r, tl.where(valid, page * page_size + pos % page_size, 0), mask=ok)


@triton.jit
def step_inputs_kernel(tokens_ptr, positions_ptr, embed_ptr, cos_ptr, sin_ptr, x_ptr, cos_out_ptr, sin_out_ptr,
                       vocab, hidden, half, stride_e, stride_c, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr):
    """Row t's token embedding and its position's RoPE angles (a token id past the table
    reads zeros, not another tensor's memory)."""
    t = tl.program_id(0)
    token = tl.load(tokens_ptr + t)
    width = tl.where((token >= 0) & (token < vocab), hidden, 0)  # of the row read
    h = tl.arange(0, BLOCK_H)
    row = tl.load(embed_ptr + token * stride_e + h, mask=h < width, other=0.0)
    tl.store(x_ptr + t * hidden + h, row, mask=h < hidden)
    position = tl.load(positions_ptr + t)
    p = tl.arange(0, BLOCK_P)
    tl.store(cos_out_ptr + t * half + p, tl.load(cos_ptr + position * stride_c + p, mask=p < half), mask=p < half)
    tl.store(sin_out_ptr + t * half + p, tl.load(sin_ptr + position * stride_c + p, mask=p < half), mask=p < half)


def step_inputs(embed, tokens, cos_table, sin_table, positions):
    """(embed[tokens], cos_table[positions], sin_table[positions]) in one launch, the step's
    first: as three torch gathers they took ~10 us of a Qwen3-0.6B batch-1 step on an H100,
    and, launched outside programmatic launch, kept the first layer from loading its weights
    meanwhile (docs/log/2026-11-27-batch-1-step-timeline-step-inputs.md)."""
    n, hidden, half = tokens.shape[0], embed.shape[1], cos_table.shape[1]
    x = torch.empty(n, hidden, device=embed.device, dtype=embed.dtype)
    cos = torch.empty(n, half, device=embed.device, dtype=cos_table.dtype)
    sin = torch.empty_like(cos)
    step_inputs_kernel[(n,)](tokens, positions, embed, cos_table, sin_table, x, cos, sin, embed.shape[0], hidden, half,
                             embed.stride(0), cos_table.stride(0), BLOCK_H=triton.next_power_of_2(hidden),
                             BLOCK_P=triton.next_power_of_2(half), num_warps=STEP_INPUTS_WARPS)
    return x, cos, sin


def token_buckets(largest):
    """Token counts with a prefill graph: 16, 24, 32, 48, 64, ... (powers of two and the
    halfway points between them), then `largest`: a call computes at most 1.5x its tokens."""
    sizes, size = set(), 16
    while size < largest:
        sizes |= {size, size + size // 2}
        size *= 2
    return sorted({s for s in sizes if s < largest} | {largest})


def prompt_groups(lengths, limit):
    """Index ranges [a, b) of consecutive prompts with at most `limit` tokens each (a longer
    prompt alone)."""
    groups, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and tokens + n > limit:
            groups.append((start, i))
            start, tokens = i, 0
        tokens += n
    return groups + [(start, len(lengths))]


class Engine:
    def __init__(self, model_config, weight_dir, device):
        self.device = torch.device(device)
        self.dtype = compute_dtype(model_config, device)
        self.rope_dtype = rope_table_dtype(model_config, self.dtype)
        self.num_heads = model_config["num_attention_heads"]
        self.num_kv_heads = model_config["num_key_value_heads"]
        self.head_dim = model_config["head_dim"]
        self.eps = float(model_config.get("rms_norm_eps") or 1e-5)
        self.rope_theta = float(model_config.get("rope_theta") or 10000.0)
        self.rope_scaling = model_config.get("rope_scaling")
        self.w = load_weights(model_config, weight_dir, self.device, self.dtype)
        if any("linear" in layer for layer in self.w["layers"]):
            # Its captured prefills know no request, and a DeltaNet's chunked prefill runs per request.
            raise NotImplementedError("Engine.cuda_graphs_prefill does not serve a hybrid's Gated DeltaNet "
                                      "layers (Qwen3.5): Engine.cuda_graphs does")
        self.cache = KVCache(model_config, self.device, self.dtype)
        every_position = torch.arange(self.cache.max_positions, device=self.device)
        self.rope_cos, self.rope_sin = rope_tables(every_position, self.head_dim, self.rope_theta,
                                                   self.rope_dtype, self.rope_scaling)  # [max_positions, head_dim/2]
        self.buckets = {"decode": graph_buckets(MAX_GRAPH_BATCH), "prefill": token_buckets(MAX_PREFILL_TOKENS)}
        rows = max(MAX_GRAPH_BATCH, MAX_PREFILL_TOKENS)
        # A call's host metadata (see `metadata`) goes to the device in one copy. Zeros
        # address the cache's scratch row 0 and position 0: harmless padding. A decode's
        # block table is staged after its slots, so the room for the largest one.
        self.graph_width = graph_width(self.cache)
        staged = max(3 * MAX_PREFILL_PROMPTS, MAX_GRAPH_BATCH * self.graph_width)
        self.meta = torch.zeros(2 * rows + staged, dtype=torch.long, device=self.device)
        self.static = {
            "meta": self.meta,
            "tokens": torch.zeros(rows, dtype=torch.long, device=self.device),
            "block_table": torch.zeros(MAX_GRAPH_BATCH, self.graph_width, dtype=torch.long,
                                       device=self.device),
        }
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
            self.graph_logits[key] = captured(graph, self.graph_pool, lambda: self.forward_static(*key))
            self.graph_pool = graph.pool() if self.graph_pool is None else self.graph_pool
            self.graphs[key] = graph
        for graph in self.graphs.values():  # a graph's first launch costs more than the next
            graph.replay()                   # ones: paid here, not in the first call of a kind
        torch.cuda.synchronize(self.device)

    @staticmethod
    def metadata(meta, kind, size):
        """The views of `meta` a graph of `size` rows reads, one after another, so that one
        copy of a call's host list fills them all. A decode's: every row's position, then its
        cache slot. A prefill's: each prompt's start, length, last row and first page in
        `pages`, then the prompts' pages, one run each (at most a page a token and one more
        a prompt)."""
        prompts = MAX_PREFILL_PROMPTS
        ends = list(itertools.accumulate([size, size] if kind == "decode" else [prompts] * 4 + [size + prompts]))
        return [meta[a:b] for a, b in zip([0] + ends, ends)]

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
        if size is None or len(ids) > MAX_PREFILL_PROMPTS:  # eager: larger than any graph
            return torch.cat([self.prefill_eager(ids[a:b], input_ids[a:b], lengths[a:b])
                              for a, b in prompt_groups(lengths, EAGER_PREFILL_TOKENS)])
        tables = self.cache.host_tables(Step(ids, [0] * len(ids), lengths, None, False))
        starts, page_starts = [0], [0]
        for n, table in zip(lengths[:-1], tables):
            starts.append(starts[-1] + n)
            page_starts.append(page_starts[-1] + len(table))
        # `metadata`'s layout; padding prompts have length 0 (their rows: position 0, the scratch row).
        prompts = [0] * (MAX_PREFILL_PROMPTS - len(ids))
        flat = starts + prompts + lengths + prompts + [a + n - 1 for a, n in zip(starts, lengths)] + prompts
        flat += page_starts + prompts
        for table in tables:
            flat += table
        host = torch.frombuffer(array.array("q", flat), dtype=torch.long)
        tokens = self.static["tokens"][:total]

        # Prompts already on the device, 1-D (as the benchmark draws them): one cat, no per-prompt
        # reshape and move (~20 us of host time for 4 prompts on an H100's host, ~70 on a slow one).
        on_device = all(t.device.type == self.device.type and t.dim() == 1 for t in input_ids)

        def fill():
            self.meta[:host.shape[0]].copy_(host, non_blocking=True)
            torch.cat(input_ids if on_device else [t.reshape(-1).to(self.device) for t in input_ids], out=tokens)

        fill()
        self.recapture_if_moved(fill)
        return self.run_static("prefill", size, len(ids))

    def prefill_eager(self, ids, input_ids, lengths):
        """Logits of a group of prompts, run eagerly. Its metadata (`metadata`'s, unpadded) is
        one host array, copied from pinned memory without waiting for the device, so that a
        group's launches queue behind the last group's work instead of after it."""
        n, total = len(ids), sum(lengths)
        step = Step(ids, [0] * n, lengths, None, False)
        slots, _ = self.cache.host_addresses(step)
        starts = [0]
        for length in lengths[:-1]:
            starts.append(starts[-1] + length)
        flat = [p for length in lengths for p in range(length)] + slots + starts + lengths
        flat += [a + length - 1 for a, length in zip(starts, lengths)]
        host = torch.frombuffer(array.array("q", flat), dtype=torch.long)
        meta = (host.pin_memory() if self.device.type == "cuda" else host).to(self.device, non_blocking=True)
        step.positions, step.slots, step.prompt_starts, step.prompt_lengths, last = meta.split(
            [total, total, n, n, n])
        step.longest_prompt = max(lengths)  # the varlen attention's grid
        tokens = torch.cat([t.reshape(-1) for t in input_ids]).to(self.device, torch.long)
        x = self.hidden_states(tokens, step)[last]
        return rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T

    @torch.no_grad()
    def decode(self, request_ids, token_ids):
        ids = as_id_list(request_ids)
        start = [self.cache.length(rid) for rid in ids]
        size = next((b for b in self.buckets["decode"] if b >= len(ids)), None)
        if size is None or not fits_graph(self.cache, self.graph_width, start):  # eager: more, or longer
            step = Step(ids, start, [1] * len(ids), torch.tensor(start, device=self.device), True)
            return self.forward(token_ids.reshape(-1).to(self.device, torch.long), step)
        s, batch = self.static, len(ids)
        # One copy from the host and two on the device, no other torch op: every call is
        # host-bound at this size. Padding rows get position 0, the scratch row and a block
        # table of scratch pages (columns past `width` are stale, and no position reaches them).
        slots, tables = self.cache.host_addresses(Step(ids, start, [1] * batch, None, True))
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
        # `metadata`'s positions and slots, then the pages, staged where a prefill's prompts go:
        # one copy from the host, then one on the device into the table's strided rows.
        table = self.meta[2 * size:2 * size + size * width].view(size, width)
        tokens = token_ids.reshape(-1)

        def fill():
            self.meta[:flat.shape[0]].copy_(flat, non_blocking=True)
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
            positions, slots = self.metadata(s["meta"], kind, size)
            step = Step([], [], [1] * size, positions, True, slots, s["block_table"][:size])
            x = self.hidden_states(s["tokens"][:size], step)
        else:
            starts, lengths, last, page_starts, pages = self.metadata(s["meta"], kind, size)
            positions, slots = (torch.empty(size, dtype=torch.long, device=self.device) for _ in range(2))
            prefill_rows_kernel[(triton.cdiv(size, PREFILL_ROWS_BLOCK),)](
                starts, lengths, page_starts, pages, positions, slots, size, self.cache.page_size,
                PROMPTS=MAX_PREFILL_PROMPTS, BLOCK=PREFILL_ROWS_BLOCK, num_warps=PREFILL_ROWS_WARPS)
            step = Step([], [], [], positions, False, slots)
            # Read by the varlen attention instead of the host's num_new (see its allele).
            step.prompt_starts, step.prompt_lengths = starts, lengths
            x = self.hidden_states(s["tokens"][:size], step)[last]
        return rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T

    def hidden_states(self, tokens, step):
        """The residual stream [N, hidden] after every layer, for a prepared step."""
        n = tokens.shape[0]
        # [N, hidden]; [N, head_dim/2] each
        x, cos, sin = step_inputs(self.w["embed"], tokens, self.rope_cos, self.rope_sin, step.positions)
        out = None  # what the last MLP adds to the residual stream x
        for i, layer in enumerate(self.w["layers"]):
            q, k, v, x = norm_qkv(x, out, layer["input_norm"], layer, self.eps)
            q, k, v = (t.view(n, -1, self.head_dim) for t in (q, k, v))
            attn_out = attention(q, k, v, layer, cos, sin, self.cache, step, i, self.eps) @ layer["o"].T
            del q, k, v  # not alive through the MLP, where a large prefill's peak is
            out, x = norm_mlp(x, attn_out, layer["post_norm"], layer, self.eps)
        return x + out

    def forward(self, tokens, step):
        """Logits [B, vocab] of the last token of each request in `step` (eager)."""
        self.cache.prepare(step)
        x = self.hidden_states(tokens, step)
        logits = rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T  # [N, vocab]
        last = torch.tensor(step.num_new, device=self.device).cumsum(0) - 1
        return logits[last]
