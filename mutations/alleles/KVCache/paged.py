"""K/V in a pool of fixed-size pages per layer, with a block table of page ids per request.

Each layer's pool is [pages, PAGE_SIZE, kv_heads, head_dim].
Pages are taken as a request grows and given back when it is removed or re-prefilled, so
memory follows the live tokens, not max_position_embeddings per request. Page 0 is scratch
and belongs to no request: padded rows of a static-shape batch write and read there. The
first pool holds POOL_PAGES pages, whatever max_position_embeddings is; when it runs out it
doubles (a copy; `generation` counts reallocations, so a captured graph knows its addresses
are stale). A request longer than max_position_embeddings raises.
"""
import torch

REQUIRES = {}
DEVICES = "any"

PAGE_SIZE = 16  # range: 8..256; tokens per page
POOL_PAGES = 256  # range: 16..65536; pages in the first pool, which doubles when they run out


class KVCache:
    """K/V in pages of PAGE_SIZE tokens per layer, with a block table (page ids) per request."""

    def __init__(self, model_config, device, dtype):
        self.num_layers = model_config["num_hidden_layers"]
        self.reference_rounding = rounds_like_reference(model_config, dtype)  # read by attention alleles
        self.max_positions = int(model_config.get("max_position_embeddings") or 4096)
        self.page_size = PAGE_SIZE
        self.max_pages = -(-self.max_positions // PAGE_SIZE)  # pages of one full-length request
        self.row_shape = (model_config["num_key_value_heads"], model_config["head_dim"])
        self.device, self.dtype = device, dtype
        self.pages_of, self.lengths, self.free = {}, {}, []
        self.k, self.v = [], []
        self.generation = -1
        self.grow(1 + POOL_PAGES)

    def grow(self, num_pages):
        """Reallocate every layer's pool with `num_pages` pages, keeping what it holds."""
        old = self.k[0].shape[0] if self.k else 0
        shape = (num_pages, self.page_size, *self.row_shape)
        self.k = regrown(self.k, self.num_layers, shape, self.device, self.dtype)
        self.v = regrown(self.v, self.num_layers, shape, self.device, self.dtype)
        self.free += range(num_pages - 1, max(old, 1) - 1, -1)  # popped lowest first
        self.generation += 1

    def length(self, request_id):
        return self.lengths[request_id]

    def take_pages(self, count):
        while len(self.free) < count:
            self.grow(2 * self.k[0].shape[0])
        return [self.free.pop() for _ in range(count)]

    def prepare(self, step):
        """Give each request the pages its new tokens need, and address them."""
        prepare_pages(self, step)

    def host_addresses(self, step):
        """prepare's bookkeeping, its addresses as host lists: (slots, block table rows)."""
        return host_pages(self, step)

    def host_tables(self, step):
        """prepare's bookkeeping; each request's block table row, as host lists."""
        return reserved_tables(self, step)

    def write(self, layer, step, k, v):
        """Store packed k, v [N, kv_heads, head_dim] at the rows `prepare` chose."""
        self.k[layer].view(-1, *self.row_shape)[step.slots] = k  # flat view: [pages*page_size, ...]
        self.v[layer].view(-1, *self.row_shape)[step.slots] = v

    def read(self, layer, request_id):
        n = self.lengths[request_id]
        pages = torch.tensor(self.pages_of[request_id], device=self.device)
        return (self.k[layer][pages].flatten(0, 1)[:n],  # [T, kv_heads, D]
                self.v[layer][pages].flatten(0, 1)[:n])

    def remove(self, request_ids):
        for rid in request_ids:
            if rid in self.pages_of:
                self.free += self.pages_of.pop(rid)
                del self.lengths[rid]
