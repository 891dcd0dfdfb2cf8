"""One K/V slab per layer, [slots, rows, kv_heads, head_dim], a slot of `rows` positions per request.

Request ids are not slot numbers: a dict maps them. Slot 0 is scratch and belongs to no
request: padded rows of a static-shape batch (CUDA graphs) write and read there. The slab
grows with need, by copying: its slots double when every one is taken (its rows then
fitted to the longest live request), its rows double (up to max_position_embeddings) when
a request needs more; `generation` counts the reallocations, so a graph captured over the
old tensors knows it is stale. (Sized for max_position_embeddings up front, the public
config's batch of 64 asked for 1.2 GB a tensor and failed its allocation on a CPU; with
rows that never shrank, a 1500-token prompt and then that batch still asked for 0.8 GB.)
A request may hold up to the config's max_position_embeddings tokens; a longer one raises
rather than spill into its neighbour. For attention kernels the slab is a paged cache
with one page of `page_size` rows per request: `block_table` is [B, 1], and `slots` the
flat row of every token.
"""
REQUIRES = {}
DEVICES = "any"

SLAB_SLOTS = 16  # range: 4..256; slots allocated up front (slot 0 is scratch)
SLAB_ROWS = 256  # range: 16..4096; positions per slot up front


class KVCache:
    """K/V in one slab per layer, [slots, page_size, kv_heads, head_dim]; a slot per request."""

    def __init__(self, model_config, device, dtype):
        self.num_layers = model_config["num_hidden_layers"]
        self.reference_rounding = rounds_like_reference(model_config, dtype)  # read by attention alleles
        self.max_positions = int(model_config.get("max_position_embeddings") or 4096)
        self.page_size, self.max_pages = min(SLAB_ROWS, self.max_positions), 1  # one page per request
        self.row_shape = (model_config["num_key_value_heads"], model_config["head_dim"])
        self.device, self.dtype = device, dtype
        self.slot_of, self.lengths, self.free = {}, {}, []
        self.k, self.v = [], []
        self.generation = -1
        self.grow(SLAB_SLOTS)

    def grow(self, num_slots, rows=None):
        """Reallocate every layer's slab with `num_slots` slots of `rows` positions (by
        default what the longest live request needs: rows a gone request took are given
        back), keeping what it holds."""
        old = self.k[0].shape[0] if self.k else 0
        self.page_size = rows or self.rows_for(max(self.lengths.values(), default=0))
        shape = (num_slots, self.page_size, *self.row_shape)
        self.k = regrown(self.k, self.num_layers, shape, self.device, self.dtype)
        self.v = regrown(self.v, self.num_layers, shape, self.device, self.dtype)
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
        prepare_pages(self, step)  # block table [B, 1]: each request's slot

    def host_addresses(self, step):
        """prepare's bookkeeping, its addresses as host lists: (slots, block table rows)."""
        self.reserve(step)
        slots = [self.slot_of[rid] for rid in step.request_ids]
        ends = [self.lengths[rid] for rid in step.request_ids]
        rows = [s * self.page_size + p for s, e, n in zip(slots, ends, step.num_new) for p in range(e - n, e)]
        return rows, [[s] for s in slots]

    def host_tables(self, step):
        """prepare's bookkeeping; each request's block table row (its slot), as host lists."""
        self.reserve(step)
        return [[self.slot_of[rid]] for rid in step.request_ids]

    def reserve(self, step):
        """A slot for each new request; the lengths after this step."""
        for rid, n in zip(step.request_ids, step.num_new):
            total = n if not step.is_decode else self.lengths[rid] + n
            if total > self.max_positions:
                raise ValueError(f"request {rid} would hold {total} tokens, more than "
                                 f"max_position_embeddings={self.max_positions}")
            if rid not in self.slot_of:  # a prefill of a live id keeps its slot and replaces its K/V
                self.slot_of[rid] = self.take_slot()
            self.lengths[rid] = total
        longest = max((self.lengths[rid] for rid in step.request_ids), default=0)
        if longest > self.page_size:
            self.grow(self.k[0].shape[0], self.rows_for(longest))

    def rows_for(self, tokens):
        """SLAB_ROWS, doubled until `tokens` fit (at most max_position_embeddings)."""
        rows = SLAB_ROWS
        while rows < tokens:
            rows *= 2
        return min(rows, self.max_positions)

    def write(self, layer, step, k, v):
        """Store packed k, v [N, kv_heads, head_dim] at the rows `prepare` chose."""
        self.k[layer].view(-1, *self.row_shape)[step.slots] = k  # flat view: [slots*page_size, ...]
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
