"""The decode step captured in CUDA graphs for bucketed batch sizes, all inside create_engine.

Static buffers sized for the largest bucket; one graph per bucket, captured largest first
into one memory pool (nano-vllm's capture_cudagraph / run_model). A decode of B requests
copies its tokens, positions, cache rows and block table into the first B rows of the
buffers and replays the smallest bucket >= B. Padding rows point at the cache's scratch
slot or page (row 0, owned by no request), so whatever they compute is harmless, and their
logits are dropped. Prefill, and decode batches above the largest bucket or past
GRAPH_MAX_POSITIONS, run eagerly.
On CPU there are no graphs: `replay` runs the same static-buffer forward eagerly, so the
CPU gate exercises the padding path too. RoPE tables are built once here, for every
position up to max_position_embeddings, so a captured step never builds one.

Needs a KV cache with row addressing and static addresses (slab or paged; when one grows,
its tensors move and the graphs are captured again) and a decode attention of static shape.
A hybrid's DeltaNet layers (Qwen3.5) decode in graphs only when their recurrent states keep
static addresses too (RecurrentState.slots: padding rows in its scratch slot 0); with the
seed's states a hybrid decodes eagerly.
"""
import torch

# In order of preference (a swap repairs to the first that runs where it runs): pages grow
# a request at a time, a slab gives every slot the longest request's rows.
REQUIRES = {"KVCache": ("paged", "slab", "paged_chunks"), "attend_decode": ("table_sdpa", "triton_split_kv")}
DEVICES = "any"
# On a CPU the graphs replay eagerly (0.15x there,
# docs/log/2026-11-23-cpu-default-run-gpu-levers-last.md); on an H100/H200 2.9-3.2x decode
# (docs/log/2026-11-21-cuda-only-alleles-final-gate.md, H100;
# docs/log/2026-11-21-every-operator-alone-on-seed.md, H200).
GPU_LEVER = True


class Engine:
    def __init__(self, model_config, weight_dir, device):
        self.device = torch.device(device)
        self.dtype = compute_dtype(model_config, device)
        self.rope_dtype = rope_table_dtype(model_config, self.dtype)
        self.num_heads = model_config["num_attention_heads"]
        self.num_kv_heads = model_config["num_key_value_heads"]
        self.head_dim = model_config["head_dim"]
        self.rotary_dim = model_config.get("rotary_dim", self.head_dim)  # (read_config before Qwen3.5 set none)
        self.eps = float(model_config.get("rms_norm_eps") or 1e-5)
        self.rope_theta = float(model_config.get("rope_theta") or 10000.0)
        self.rope_scaling = model_config.get("rope_scaling")
        self.w = load_weights(model_config, weight_dir, self.device, self.dtype)
        self.cache = KVCache(model_config, self.device, self.dtype)
        self.states = RecurrentState(model_config, self.device)
        # A hybrid's states must stay where a graph reads them (a slot per request).
        self.graphs_hold_states = getattr(self.states, "static_addresses", False) or \
            not any("linear" in layer for layer in self.w["layers"])
        every_position = torch.arange(self.cache.max_positions, device=self.device)
        self.rope_cos, self.rope_sin = rope_tables(every_position, self.rotary_dim, self.rope_theta,
                                                   self.rope_dtype, self.rope_scaling)  # [max_positions, head_dim/2]
        self.buckets = graph_buckets(MAX_GRAPH_BATCH)
        self.graph_width = graph_width(self.cache)
        largest = self.buckets[-1]
        self.static = {  # zeros address the cache's scratch row 0: harmless padding
            "tokens": torch.zeros(largest, dtype=torch.long, device=self.device),
            "positions": torch.zeros(largest, dtype=torch.long, device=self.device),
            "slots": torch.zeros(largest, dtype=torch.long, device=self.device),
            "block_table": torch.zeros(largest, self.graph_width, dtype=torch.long, device=self.device),
            "state_slots": torch.zeros(largest, dtype=torch.long, device=self.device),
        }
        self.graphs, self.graph_logits, self.graph_pool = {}, {}, None
        self.capture_graphs()

    @torch.no_grad()
    def capture_graphs(self):
        """One graph per bucket, largest first, sharing one memory pool; none on CPU."""
        self.graphs, self.graph_logits, self.graph_pool = {}, {}, None
        self.captured_generation = self.generation()
        if self.device.type != "cuda":
            return  # nothing to capture: `replay` runs forward_static eagerly
        for buffer in self.static.values():
            buffer.zero_()  # capture computes on padding rows only: it touches scratch alone
        for size in reversed(self.buckets):
            self.graph_logits[size] = self.forward_static(size)  # warm-up: JIT, lazy state
            graph = torch.cuda.CUDAGraph()
            self.graph_logits[size] = captured(graph, self.graph_pool, lambda: self.forward_static(size))
            self.graph_pool = graph.pool() if self.graph_pool is None else self.graph_pool
            self.graphs[size] = graph
        for graph in self.graphs.values():  # a graph's first launch costs more than the next
            graph.replay()                   # ones: paid here, not in a timed call
        torch.cuda.synchronize(self.device)

    def replay(self, size, tokens, step):
        """Logits [B, vocab] of a prepared decode step through the graph of bucket `size`."""
        batch, width = step.block_table.shape
        s = self.static
        for name in ("tokens", "positions", "slots", "block_table", "state_slots"):
            s[name][:size].zero_()  # padding rows -> scratch row 0, position 0, state slot 0
        s["tokens"][:batch] = tokens
        s["positions"][:batch] = step.positions
        s["slots"][:batch] = step.slots
        s["block_table"][:batch, :width] = step.block_table
        if step.state_slots is not None:
            s["state_slots"][:batch] = step.state_slots
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
        if size is None or not fits_graph(self.cache, self.graph_width, start) or not self.graphs_hold_states:
            return self.forward(tokens, step)  # eager: more requests, or longer, than any graph
        self.cache.prepare(step)
        self.states.prepare(step)
        if self.generation() != self.captured_generation:
            self.capture_graphs()  # the cache or the states grew: their tensors moved under the graphs
        return self.replay(size, tokens, step)

    def generation(self):
        """Changes whenever the tensors a graph reads move (the cache's, the states')."""
        return self.cache.generation, getattr(self.states, "generation", 0)

    def remove(self, request_ids):
        self.cache.remove(as_id_list(request_ids))
        self.states.remove(as_id_list(request_ids))

    def forward_static(self, size):
        """Decode logits [size, vocab] of the static buffers' first `size` rows."""
        s = self.static
        step = Step([], [], [1] * size, s["positions"][:size], True, s["slots"][:size],
                    s["block_table"][:size], s["state_slots"][:size])
        x = self.hidden_states(s["tokens"][:size], step)
        return rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T  # one token per row

    def hidden_states(self, tokens, step):
        """The residual stream [N, hidden] after every layer, for a prepared step."""
        cos, sin = self.rope_cos[step.positions], self.rope_sin[step.positions]  # [N, head_dim/2]
        x = self.w["embed"][tokens]  # [N, hidden]
        out = None  # what the last MLP adds to the residual stream x
        for i, layer in enumerate(self.w["layers"]):
            out, x = decoder_layer(x, out, layer, cos, sin, self.cache, self.states, step, i, self.head_dim, self.eps)
        return x + out

    def forward(self, tokens, step):
        """Logits [B, vocab] of the last token of each request in `step` (eager)."""
        self.cache.prepare(step)
        self.states.prepare(step)
        x = self.hidden_states(tokens, step)
        logits = rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T  # [N, vocab]
        last = torch.tensor(step.num_new, device=self.device).cumsum(0) - 1
        return logits[last]
