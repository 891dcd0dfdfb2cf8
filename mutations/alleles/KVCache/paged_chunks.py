"""K/V pages in chunks added as requests need them; a chunk never moves, so captured graphs
stay valid while the pool grows.

`paged` starts with POOL_PAGES pages and copies itself into a pool twice the size when it
runs out: every graph captured over the old pool is then stale and is captured again,
inside whatever call grew it (on a 1B-class model, 64 requests of 256
tokens grew it twice and the recapture cost more than the decode). Here the pool is a list
of chunks of CHUNK_PAGES pages, each [layers, 2 (K, V), CHUNK_PAGES, PAGE_SIZE, kv_heads,
head_dim], allocated when the free pages run out. Kernels find page p in chunk
p >> chunk_shift (CHUNK_PAGES a power of two) through `chunk_offsets`, a device table of
each chunk's distance in elements from chunk 0 (whose K and V views, `k[layer]` and
`v[layer]`, are the anchors), so a new chunk is one table entry, not a new address under a
graph. Memory follows the trace, a chunk at a time. Page 0 is scratch, owned by no request.

bf16 in the contract's format is the exception: its decode takes the reference's math
(`rounds_like_reference`), which gathers pages with torch indexing on `k[layer]`, so there
the pool is one tensor that moves when it grows (as in `paged`, with `generation` telling
graph engines to capture again).
"""
import torch
import triton
import triton.language as tl

REQUIRES = {"attend_decode": ("triton_split_kv",)}
DEVICES = "cuda"

PAGE_SIZE = 16  # range: 8..256; tokens per page
# Pages added at a time when the free ones run out: the pool's granularity (512 tokens, 11 MB
# on a 1B-class model; 128 pages left 44 MB idle in each engine).
CHUNK_PAGES = 32  # range: 16..4096
MOVING_POOL_PAGES = 128  # range: 16..4096; a bf16 pool's first size: each growth captures graphs again
WRITE_ROWS_WARPS = 4  # range: 1..16; warps a program writing a token's K/V row runs with (Triton's default: 4)
MAX_CHUNKS = 4096  # the chunk table's length: its address is fixed once graphs are captured


@triton.jit
def write_rows_kernel(k_ptr, v_ptr, k_pool_ptr, v_pool_ptr, slots_ptr, offsets_ptr, stride_kt, stride_vt,
                      stride_pool_page, stride_pool_row, chunk_shift, PAGE_SIZE: tl.constexpr,
                      ROW: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    base = slot_row(offsets_ptr, tl.load(slots_ptr + t), chunk_shift, stride_pool_page, stride_pool_row, PAGE_SIZE)
    i = tl.arange(0, BLOCK)
    ok = i < ROW
    tl.store(k_pool_ptr + base + i, tl.load(k_ptr + t.to(tl.int64) * stride_kt + i, mask=ok), mask=ok)
    tl.store(v_pool_ptr + base + i, tl.load(v_ptr + t.to(tl.int64) * stride_vt + i, mask=ok), mask=ok)


class KVCache:
    """K/V pages in chunks that never move (one growing tensor in bf16), a block table per request."""

    def __init__(self, model_config, device, dtype):
        self.num_layers = model_config["num_hidden_layers"]
        self.reference_rounding = rounds_like_reference(model_config, dtype)  # read by attention alleles
        self.max_positions = int(model_config.get("max_position_embeddings") or 4096)
        self.page_size = PAGE_SIZE
        self.max_pages = -(-self.max_positions // PAGE_SIZE)  # pages of one full-length request
        self.row_shape = (model_config["num_key_value_heads"], model_config["head_dim"])
        self.device, self.dtype = device, dtype
        self.moves = self.reference_rounding  # one tensor, reallocated to grow
        self.chunk_pages = 2 ** 40 if self.moves else CHUNK_PAGES  # a moving pool is one chunk
        if self.chunk_pages & (self.chunk_pages - 1):  # kernels find a page's chunk by a shift
            raise ValueError(f"CHUNK_PAGES must be a power of two, not {CHUNK_PAGES}")
        self.chunk_shift = self.chunk_pages.bit_length() - 1
        self.chunk_offsets = torch.zeros(MAX_CHUNKS, dtype=torch.long, device=device)
        self.chunks, self.k, self.v = [], [], []
        self.pages_of, self.lengths, self.free = {}, {}, []
        self.num_pages = 0
        self.generation = 0
        self.add_pages(MOVING_POOL_PAGES if self.moves else CHUNK_PAGES)

    def add_pages(self, count):
        """A new chunk of `count` pages; in bf16, the one pool reallocated `count` pages larger."""
        shape = (self.num_layers, 2, count, self.page_size, *self.row_shape)
        if self.moves:
            pool = torch.zeros((*shape[:2], self.num_pages + count, *shape[3:]), device=self.device, dtype=self.dtype)
            if self.chunks:
                pool[:, :, :self.num_pages] = self.chunks[0]
                self.generation += 1
            self.chunks = [pool]
        else:
            if len(self.chunks) == MAX_CHUNKS:
                raise RuntimeError(f"the K/V pool is full: {MAX_CHUNKS} chunks of {CHUNK_PAGES} pages")
            # Chunks after the first are left unwritten: every kernel masks its K/V loads to
            # the rows a request wrote (a chunk grows inside a timed call: zeros cost a fill).
            chunk = torch.empty(shape, device=self.device, dtype=self.dtype) if self.chunks else \
                torch.zeros(shape, device=self.device, dtype=self.dtype)
            anchor = self.chunks[0] if self.chunks else chunk
            offset = (chunk.data_ptr() - anchor.data_ptr()) // chunk.element_size()
            if offset % CHUNK_ALIGN:  # the kernels' loads are compiled for it (shared.chunk_row)
                raise RuntimeError(f"K/V chunk {len(self.chunks)} sits {offset} elements from chunk 0, "
                                   f"not a multiple of {CHUNK_ALIGN}")
            self.chunk_offsets[len(self.chunks)] = offset
            self.chunks.append(chunk)
        if self.moves or len(self.chunks) == 1:  # chunk 0 is new: the views every kernel anchors on
            self.k = [self.chunks[0][layer, 0] for layer in range(self.num_layers)]  # [pages, page_size, kv_heads, D]
            self.v = [self.chunks[0][layer, 1] for layer in range(self.num_layers)]
        self.free += range(self.num_pages + count - 1, max(self.num_pages, 1) - 1, -1)  # popped lowest first
        self.num_pages += count

    def length(self, request_id):
        return self.lengths[request_id]

    def take_pages(self, count):
        while len(self.free) < count:
            self.add_pages(max(CHUNK_PAGES, self.num_pages) if self.moves else CHUNK_PAGES)
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
        if k.shape[0] == 0:
            return
        k, v = (x if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] else x.contiguous() for x in (k, v))
        k_pool, v_pool = self.k[layer], self.v[layer]
        row = self.row_shape[0] * self.row_shape[1]
        write_rows_kernel[(k.shape[0],)](k, v, k_pool, v_pool, step.slots, self.chunk_offsets, k.stride(0),
                                         v.stride(0), k_pool.stride(0), k_pool.stride(1), self.chunk_shift,
                                         PAGE_SIZE=self.page_size, ROW=row, BLOCK=triton.next_power_of_2(row),
                                         num_warps=WRITE_ROWS_WARPS)

    def read(self, layer, request_id):
        n = self.lengths[request_id]
        pages = [self.chunks[p // self.chunk_pages][layer, :, p % self.chunk_pages] for p in self.pages_of[request_id]]
        kv = torch.stack(pages, dim=1).flatten(1, 2)[:, :n]  # [2, T, kv_heads, D]
        return kv[0], kv[1]

    def remove(self, request_ids):
        for rid in request_ids:
            if rid in self.pages_of:
                self.free += self.pages_of.pop(rid)
                del self.lengths[rid]
        if not self.pages_of and len(self.chunks) > 1:
            self.release_chunks()

    def release_chunks(self):
        """An empty pool gives back every chunk but the first, whose views anchor the kernels'
        addresses (`chunk_offsets` entries past it are written again as chunks come back): an
        idle engine holds one chunk, not its busiest moment's (on a 1B-class model, the
        benchmark's warm-up engine kept 352-440 MB)."""
        del self.chunks[1:]
        self.num_pages = self.chunks[0].shape[2]
        self.free = list(range(self.num_pages - 1, 0, -1))  # popped lowest first; page 0 is scratch
