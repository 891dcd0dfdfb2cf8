"""Helpers several alleles share. A swap pulls in those a program names (after the
allele's own file, before the seed's); nothing here is a gene."""
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

MAX_GRAPH_BATCH = 64  # range: 8..256, fits: decode_batch; the largest batch a decode graph is captured for
GRAPH_BUCKET_STEP = 16  # range: 4..64; decode graphs above batch 8 are captured every this many
# The longest request a decode graph serves; longer ones decode eagerly. A graph's block
# table is this wide whatever a step holds, and attention that reads the whole table
# (table_sdpa) pays for all of it: as wide as max_position_embeddings, Llama 3.2's 131,072
# positions put a 64 GiB allocation in the batch-64 graph
# (docs/log/2026-11-25-serve-launched-ahead-seed-only-one-b-bf16.md). The split-KV kernel
# reads live pages only: for it this bounds the static table, and doubling it costs little.
GRAPH_MAX_POSITIONS = 8192  # range: 256..131072
# The same in the contract's bf16, where table_sdpa rounds like its reference with masked
# math over the whole table at every captured step (all 6,000 positions of the public
# config's, docs/log/2026-11-25-cpu-what-changed-decode-graph-width.md). The split-KV kernel
# reads live pages there too, but the graphs cannot tell which attention a program has.
ROUNDED_GRAPH_POSITIONS = 1024  # range: 128..8192
ROPE_WARPS = 4  # range: 1..16; warps a program runs with (Triton's default: 4)


def sdpa(q, k, v, attn_mask=None, is_causal=False):
    """F.scaled_dot_product_attention (GQA allowed), except in bf16.

    Fused kernels keep the probabilities in fp32 through @ v; the reference rounds them to
    the compute dtype first. In fp16 that is rounding noise (under half the tolerance on an
    H200); in bf16 it misses the reference by 1.7-2.8x the tolerance even with the
    contract's 0.02 weights (docs/log/2026-11-21-every-operator-alone-on-seed.md), so bf16
    takes the reference's math.
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


def launch_rope(kernel, x, cos, sin):
    """x [N, heads, head_dim] rotated by a Triton RoPE kernel, one program a token (the
    `apply_rope` alleles' kernels take the same arguments), over the first 2 * cos.shape[-1]
    dimensions of each head (all but in Qwen3.5, whose heads keep the rest as they are)."""
    num_tokens, num_heads, head_dim = x.shape
    half = cos.shape[-1]  # pairs turned: the kernel reads and writes no column past them
    if 2 * half < head_dim:
        out = x.clone(memory_format=torch.contiguous_format)
    else:
        out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    if num_tokens == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    kernel[(num_tokens,)](x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), out.stride(0), out.stride(1),
                          num_heads, HALF=half, BLOCK_H=triton.next_power_of_2(num_heads),
                          BLOCK_P=triton.next_power_of_2(half), num_warps=ROPE_WARPS)
    return out


def per_request_attention(q, k, v, num_new):
    """Causal attention over each packed prompt alone: q [N, heads, D] -> [N, heads*D]."""
    outs = []
    for q_r, k_r, v_r in zip(q.split(num_new), k.split(num_new), v.split(num_new)):
        out = sdpa(q_r.transpose(0, 1)[None], k_r.transpose(0, 1)[None], v_r.transpose(0, 1)[None],
                   is_causal=True)  # [1, heads, t, D]
        outs.append(out[0].transpose(0, 1).flatten(1))  # [t, heads*D]
    return torch.cat(outs)


def stack_rows(layer, name, parts):
    """Replace the weights `parts` of one layer by `name`, their rows stacked (one matmul
    instead of len(parts)), and `name`_sizes, their row counts for the split after it."""
    layer[name + "_sizes"] = tuple(layer[p].shape[0] for p in parts)
    layer[name] = torch.cat([layer.pop(p) for p in parts])  # [sum of rows, hidden]


def regrown(pools, num_layers, shape, device, dtype):
    """One zeroed pool of `shape` per layer, holding what `pools` (empty at first) held in
    the leading corner both share (more pages; more slots, with more or fewer rows each).
    Zeros, not empty: a masked SDPA multiplies stale rows by 0, and 0 * NaN is NaN."""
    new = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
    for old, grown in zip(pools, new):
        corner = tuple(slice(0, min(a, b)) for a, b in zip(old.shape, grown.shape))
        grown[corner] = old[corner]
    return new


def graph_buckets(largest):
    """Batch sizes with a decode graph: 1, 2, 4, 8, then every multiple of GRAPH_BUCKET_STEP
    above 8 up to `largest`."""
    steps = range(GRAPH_BUCKET_STEP, largest + 1, GRAPH_BUCKET_STEP)
    return sorted({b for b in (1, 2, 4, 8) if b <= largest} | {b for b in steps if b > 8} | {largest})


def graph_width(cache):
    """Block-table columns of a decode graph: one request's pages, up to GRAPH_MAX_POSITIONS
    (ROUNDED_GRAPH_POSITIONS where attention rounds like its reference)."""
    positions = ROUNDED_GRAPH_POSITIONS if cache.reference_rounding else GRAPH_MAX_POSITIONS
    return min(cache.max_pages, -(-positions // cache.page_size))


CAPTURE_STREAMS = {}  # device -> the side stream every capture on it runs on


def captured(graph, pool, forward):
    """forward()'s output, its launches captured into `graph` (its memory from `pool`, a new
    pool if None) on a side stream, as torch.cuda.graph captures, less its emptying of the
    allocator's caches: an engine made where another was just dropped gave that one's memory
    back to the driver, and its runs allocated afresh on the clock (an H100, long prompts:
    ~10 cudaMalloc a run, 1.1-1.4x slower runs;
    docs/log/2026-11-27-judge-runner-checksum-graphs-allocator.md). One
    stream for every capture, as torch.cuda.graph keeps: the allocator reuses a freed block
    on its own stream only, and with a stream per capture the pool grew by 1 GB."""
    device = torch.cuda.current_device()
    if device not in CAPTURE_STREAMS:
        CAPTURE_STREAMS[device] = torch.cuda.Stream()
    stream = CAPTURE_STREAMS[device]
    torch.cuda.synchronize()  # the side stream starts after all that came before, as torch.cuda.graph's does
    with torch.cuda.stream(stream):
        graph.capture_begin(*(() if pool is None else (pool,)))
        try:
            out = forward()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return out


def fits_graph(cache, width, positions):
    """Whether requests whose new tokens stand at `positions` fit a table `width` pages wide."""
    return width == cache.max_pages or max(positions) // cache.page_size < width


def reserve_pages(cache, step):
    """Give each request of `step` the pages its new tokens need (a prefill first gives back
    whatever the request had): the bookkeeping of a paged cache, on the host alone."""
    for rid, n in zip(step.request_ids, step.num_new):
        if not step.is_decode:
            cache.free += cache.pages_of.pop(rid, [])
            cache.lengths[rid] = 0
        total = cache.lengths[rid] + n
        if total > cache.max_positions:
            raise ValueError(f"request {rid} would hold {total} tokens, more than "
                             f"max_position_embeddings={cache.max_positions}")
        pages = cache.pages_of.setdefault(rid, [])
        pages += cache.take_pages(-(-total // cache.page_size) - len(pages))
        cache.lengths[rid] = total


def prepare_pages(cache, step):
    """A cache's prepare: its `host_addresses` as device tensors, `step.block_table` [B, width]
    (page ids, 0 = scratch; a slab's slot) and `step.slots` [N] (page * page_size + offset of
    every new token)."""
    slots, tables = cache.host_addresses(step)
    width = max(len(t) for t in tables)
    step.block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], device=cache.device)
    step.slots = torch.tensor(slots, dtype=torch.long, device=cache.device)


def reserved_tables(cache, step):
    """A paged cache's host_tables: pages reserved, then each request's block table row
    (a graph prefill finds its tokens' slots on the device from these)."""
    reserve_pages(cache, step)
    return [cache.pages_of[rid] for rid in step.request_ids]


def host_pages(cache, step):
    """A paged cache's host_addresses: pages reserved, then (slot of every new token, block
    table row of every request) as plain lists: a graph engine copies them to the device in
    one go (torch ops on the host cost ~10 us each)."""
    tables = reserved_tables(cache, step)
    size = cache.page_size
    ends = [cache.lengths[rid] for rid in step.request_ids]
    if step.is_decode:  # one token a request: one comprehension (a batch of 64 is host-bound)
        return [t[(e - 1) // size] * size + (e - 1) % size for t, e in zip(tables, ends)], tables
    slots = []
    for t, e, n in zip(tables, ends, step.num_new):
        slots += [t[p // size] * size + p % size for p in range(e - n, e)]
    return slots, tables


# A chunk's distance from chunk 0 is kept a multiple of this many elements (paged_chunks
# checks it), so that K/V rows addressed from it load 16 bytes at a time.
CHUNK_ALIGN = 16


@triton.jit
def chunk_row(offsets_ptr, page, chunk_shift, stride_page, ALIGN: tl.constexpr = CHUNK_ALIGN):
    """Where page `page` of a pool in chunks of 2 ** chunk_shift pages starts, in elements from
    chunk 0's (`offsets_ptr`: each chunk's distance; a pool of one chunk passes a zero and a
    shift past any page). Shifts, not a division: a 64-bit one is a subroutine call (sm_90
    SASS). A loaded offset alone tells the compiler nothing of its alignment, and every row
    read at it went 2 bytes at a time (ld.global.b16)."""
    chunk = page >> chunk_shift
    base = tl.multiple_of(tl.load(offsets_ptr + chunk), ALIGN)
    return base + (page - (chunk << chunk_shift)) * stride_page


@triton.jit
def slot_row(offsets_ptr, slot, chunk_shift, stride_page, stride_row, PAGE_SIZE: tl.constexpr):
    """Where the cache row of `slot` (page * PAGE_SIZE + row in it) starts: chunk_row's page,
    then the row; the page size a constant, so no division is left to run."""
    return chunk_row(offsets_ptr, slot // PAGE_SIZE, chunk_shift, stride_page) + (slot % PAGE_SIZE) * stride_row


@triton.jit
def norm_rows(x, w, width, eps, dtype):
    """RMSNorm of each row of x [R, C] (fp32, zeros past `width`) by w [1, C], rounded as the
    reference rounds: statistics in fp32, cast back to `dtype`, then the weight. Returns the
    `dtype` values in fp32."""
    scale = tl.rsqrt(tl.sum(x * x, axis=1) / width + eps)[:, None]  # [R, 1]
    return ((x * scale).to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)


@triton.jit
def rotate_rows(x, cos_ptr, sin_ptr, t, stride_ct, dtype, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                BLOCK_P: tl.constexpr):
    """Token t's heads x [BLOCK_H, 2 * BLOCK_P] (fp32, interleaved pairs) rotated by its cos and
    sin, each product rounded to `dtype` before the sum as the reference's elementwise ops
    round: [BLOCK_H, 2 * BLOCK_P], fp32."""
    c, s = rope_angles(cos_ptr, sin_ptr, t, stride_ct, HALF, BLOCK_P)
    return rotate_by(x, c, s, dtype, BLOCK_H, BLOCK_P)


@triton.jit
def rope_angles(cos_ptr, sin_ptr, t, stride_ct, HALF: tl.constexpr, BLOCK_P: tl.constexpr):
    """Token t's cos and sin [1, BLOCK_P] (fp32, zeros past HALF), for rotate_by."""
    pairs = tl.arange(0, BLOCK_P)[None, :]
    c = tl.load(cos_ptr + t * stride_ct + pairs, mask=pairs < HALF, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * stride_ct + pairs, mask=pairs < HALF, other=0.0).to(tl.float32)
    return c, s


class InterpretedProducts:
    """The interpreter's stand-in for libdevice.mul_rn: numpy rounds each product already."""
    @staticmethod
    def mul_rn(a, b):
        return a * b


# A product cast to fp16 / bf16 and then added: Triton writes the multiply and the add with no
# rounding mode, which lets ptxas fuse them into one FMA of the 16-bit inputs, and the product
# is never rounded as torch's ops round it. On an H100 1 in 5 bf16 RoPE outputs differed from
# torch's ops (docs/log/2026-11-27-weights-into-l2-ahead.md); mul_rn's product (mul.rn.f32) is not
# fused.
ROUNDED = InterpretedProducts if os.environ.get("TRITON_INTERPRET") == "1" else libdevice


@triton.jit
def rotate_pair(x0, x1, c, s, dtype):
    """(x0 cos - x1 sin, x0 sin + x1 cos) of fp32 halves, fp32, each product rounded to
    `dtype` before the sum as the reference's elementwise ops round."""
    x0c, x1s = ROUNDED.mul_rn(x0, c).to(dtype).to(tl.float32), ROUNDED.mul_rn(x1, s).to(dtype).to(tl.float32)
    x0s, x1c = ROUNDED.mul_rn(x0, s).to(dtype).to(tl.float32), ROUNDED.mul_rn(x1, c).to(dtype).to(tl.float32)
    return x0c - x1s, x0s + x1c


@triton.jit
def rotate_by(x, c, s, dtype, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr):
    """rotate_rows with the angles loaded (rope_angles): a kernel can read them early."""
    x0, x1 = tl.split(tl.reshape(x, [BLOCK_H, BLOCK_P, 2]))  # [BLOCK_H, BLOCK_P] each
    first, second = rotate_pair(x0, x1, c, s, dtype)
    return tl.reshape(tl.join(first, second), [BLOCK_H, 2 * BLOCK_P])


@triton.jit
def ready_rows(x, w, c, s, width, eps, dtype, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, NORM: tl.constexpr):
    """Heads x [BLOCK_H, 2 * BLOCK_P] (fp32) as attention reads them, in `dtype`: each normed
    by w where the checkpoint has the norms (NORM; norm_rows), then rotated (rotate_by)."""
    if NORM:
        x = norm_rows(x, w, width, eps, dtype)
    return rotate_by(x, c, s, dtype, BLOCK_H, BLOCK_P).to(dtype)


# SwiGLU's arithmetic, which the kernels of mlp.swiglu_triton, mlp.glu_matmul, plus_shared_expert.triton and
# norm_mlp.folded's projection share.
EXP = tl if os.environ.get("TRITON_INTERPRET") == "1" else libdevice  # whose exp the kernels call


@triton.jit
def silu_times(gate, up, dtype):
    """silu(gate) * up from fp32 gate and up, as torch's two kernels round it: silu as CUDA's
    computes it (expf, an IEEE-rounded division) rounded to dtype, then the product."""
    return (tl.math.div_rn(gate, 1.0 + EXP.exp(-gate)).to(dtype).to(tl.float32) * up).to(dtype)


@triton.jit
def glu_kernel(x_ptr, gate_ptr, up_ptr, out_ptr, num_rows, width, num_in, stride_x, stride_g, stride_u, stride_out,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[:, cols] = silu(x @ gate[cols].T) * (x @ up[cols].T) for a few rows (mlp.glu_matmul,
    plus_shared_expert.triton): both products on the tensor cores, each rounded to the
    output's dtype as a matmul's output is rounded, then silu_times."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok, col_ok = rows < num_rows, cols < width
    gate_rows = gate_ptr + cols[:, None].to(tl.int64) * stride_g
    up_rows = up_ptr + cols[:, None].to(tl.int64) * stride_u
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, num_in, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < num_in
        x = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        ok = col_ok[:, None] & k_ok[None, :]
        gate += tl.dot(x, tl.trans(tl.load(gate_rows + k[None, :], mask=ok, other=0.0)))
        up += tl.dot(x, tl.trans(tl.load(up_rows + k[None, :], mask=ok, other=0.0)))
    dtype = out_ptr.dtype.element_ty
    out = silu_times(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), dtype)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


# The norm_qkv and norm_mlp alleles' fold: at one row (a batch-1 decode) the norm before a
# projection is a launch of its own for a few KB of work, between two that move megabytes.
# A small batch's decode (the contract's 4-10 rows) is as launch-bound; each folding program
# norms every row, so more rows cost its programs more work: the search's to try per target.
NORM_FOLD_ROWS = 1  # range: 1..16; the most rows whose norms a projection folds in
NORM_FOLD_WIDTH = 8192  # range: 1024..16384; the widest row whose norm a projection folds in
NORM_FOLD_ELEMENTS = 16384  # range: 4096..65536; weight elements a folding program holds (its columns x the row)
# 8 warps took an H100's Qwen3-0.6B batch-1 step from 0.699 to 0.691 ms and Llama-3.2-1B's from
# 0.978 to 0.984 (docs/log/2026-11-27-swiglu-in-the-gate-up-projection.md): one for the search to
# tune per target.
NORM_FOLD_WARPS = 4  # range: 1..16; warps a folding program runs with (Triton's default: 4)


@triton.jit
def norm_linear_kernel(x_ptr, r_ptr, norm_ptr, w_ptr, out_ptr, sum_ptr, normed_ptr, num_out, num_in, stride_w, eps,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RESIDUAL: tl.constexpr, ROWS: tl.constexpr = 1,
                       GLU: tl.constexpr = False, NORMED: tl.constexpr = False, PDL: tl.constexpr = False):
    """Each of ROWS contiguous rows: out[row, cols] = rms_norm(x + r)[row] @ w[cols].T,
    rounded op for op as add_rms_norm.triton and then the prefetched one-row linear round;
    program 0 writes x + r to sum. Every program norms every row itself (a few KB a row, from
    L2) with its columns of w held throughout; the rows unrolled, so one row compiles as
    before rows were taken. RESIDUAL false: rms_norm(x), no sum.
    GLU: w is a fused gate/up weight (gate rows, then num_out up rows) and out[cols] is
    silu(gate) * up, rounded as swiglu_kernel rounds it: a program holds both halves' rows.
    NORMED: program 0 writes rms_norm(x + r) to normed too (the router's input is the experts')."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    k_ok = k < num_in
    col_ok = cols < num_out
    rows = w_ptr + cols[:, None].to(tl.int64) * stride_w + k[None, :]
    ok = col_ok[:, None] & k_ok[None, :]
    # The weights first: no kernel before this one writes them.
    w = tl.load(rows, mask=ok, other=0.0)  # [BLOCK_N, BLOCK_K]
    if GLU:
        w_up = tl.load(rows + num_out.to(tl.int64) * stride_w, mask=ok, other=0.0)
    norm_w = tl.load(norm_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    if PDL:  # x and r, and the outputs' memory, belong to the kernels before
        gdc_launch_dependents()
        gdc_wait()
    dtype = out_ptr.dtype.element_ty
    for row in tl.static_range(ROWS):
        at = row * num_in + k
        total = tl.load(x_ptr + at, mask=k_ok, other=0.0).to(tl.float32)
        if RESIDUAL:  # the sum rounded to the compute dtype first, as `x + residual` in torch is
            total = (total + tl.load(r_ptr + at, mask=k_ok, other=0.0).to(tl.float32)).to(dtype)
            if tl.program_id(0) == 0:
                tl.store(sum_ptr + at, total, mask=k_ok)
            total = total.to(tl.float32)
        scale = tl.rsqrt(tl.sum(total * total, axis=0) / num_in + eps)
        normed = ((total * scale).to(dtype).to(tl.float32) * norm_w).to(dtype).to(tl.float32)  # cast, then the weight
        if NORMED and tl.program_id(0) == 0:
            tl.store(normed_ptr + at, normed.to(dtype), mask=k_ok)
        out = tl.sum(w.to(tl.float32) * normed[None, :], axis=1).to(dtype)
        if GLU:
            up = tl.sum(w_up.to(tl.float32) * normed[None, :], axis=1).to(dtype).to(tl.float32)
            out = silu_times(out.to(tl.float32), up, dtype)
        tl.store(out_ptr + row * num_out + cols, out, mask=col_ok)


def folds_norm(x, residual, weight):
    """Whether norm_linear takes x: 1 to NORM_FOLD_ROWS contiguous rows of fp16 or bf16
    (residual, weight alike) at most NORM_FOLD_WIDTH wide."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= NORM_FOLD_ROWS and x.dtype in (torch.float16, torch.bfloat16)
            and weight.dtype == x.dtype and x.shape[1] <= NORM_FOLD_WIDTH and x.is_contiguous()
            and weight.stride(-1) == 1 and (residual is None or residual.is_contiguous()))


def norm_linear(x, residual, norm_weight, weight, eps, glu=False, normed=False):
    """(rms_norm(x + residual) @ weight.T, x + residual) for a few rows (folds_norm) in one
    launch; residual None: (rms_norm(x) @ weight.T, x). glu: weight is a fused gate/up and
    the first is silu(gate) * up, [rows, intermediate]. normed: rms_norm(x + residual) third."""
    num_out = weight.shape[0] // 2 if glu else weight.shape[0]
    out = torch.empty(x.shape[0], num_out, device=x.device, dtype=x.dtype)
    total = x if residual is None else torch.empty_like(x)
    h = torch.empty_like(x) if normed else out  # unwritten unless normed
    block_k = triton.next_power_of_2(x.shape[1])
    block_n = max(1, min(16, NORM_FOLD_ELEMENTS // block_k) // (2 if glu else 1))  # glu: two halves' rows
    norm_linear_kernel[(triton.cdiv(num_out, block_n),)](
        x, x if residual is None else residual, norm_weight, weight, out, total, h, num_out, x.shape[1],
        weight.stride(0), eps, BLOCK_N=block_n, BLOCK_K=block_k, ROWS=x.shape[0],
        RESIDUAL=residual is not None, GLU=glu, NORMED=normed, num_warps=NORM_FOLD_WARPS)
    return (out, total, h) if normed else (out, total)


# mlp.swiglu_triton's kernels (its docstring says why).
SWIGLU_BLOCK = 1024  # range: 256..4096; activations a program handles
SWIGLU_WARPS = 4  # range: 1..16; warps a program runs with (Triton's default: 4)
FOLD_WIDTH = 4096  # range: 512..16384; the widest intermediate a one-row product folds into the down projection
FOLD_ELEMENTS = 16384  # range: 4096..65536; down-weight elements a folding program holds (its columns x the width)
FOLD_WARPS = 4  # range: 1..16; warps a program folding a product into the down projection runs with


@triton.jit
def swiglu_kernel(gate_up_ptr, out_ptr, stride_gt, stride_ot, width, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = i < width
    gate = tl.load(gate_up_ptr + t * stride_gt + i, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + t * stride_gt + width + i, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + i, silu_times(gate, up, out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def swiglu_down_kernel(gate_up_ptr, w_ptr, out_ptr, num_out, width, stride_w, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """out[cols] = (silu(gate) * up, rounded as swiglu_kernel rounds it) @ down[cols].T for one row."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    k_ok = k < width
    col_ok = cols < num_out
    # The weight first: no kernel before this one writes it.
    w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + k[None, :], mask=col_ok[:, None] & k_ok[None, :],
                other=0.0)
    if PDL:  # gate_up, and the output's memory, belong to the kernels before
        gdc_launch_dependents()
        gdc_wait()
    gate = tl.load(gate_up_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + width + k, mask=k_ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    product = silu_times(gate, up, dtype).to(tl.float32)
    tl.store(out_ptr + cols, tl.sum(w.to(tl.float32) * product[None, :], axis=1).to(dtype), mask=col_ok)


def swiglu_down(gate_up, down, width):
    """One row's product folded into the down projection: [1, hidden]."""
    out = torch.empty(1, down.shape[0], device=gate_up.device, dtype=gate_up.dtype)
    block_k = triton.next_power_of_2(width)
    block_n = max(1, min(16, FOLD_ELEMENTS // block_k))
    swiglu_down_kernel[(triton.cdiv(down.shape[0], block_n),)](gate_up, down, out, down.shape[0], width,
                                                               down.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
                                                               num_warps=FOLD_WARPS)
    return out


def swiglu(gate_up, layer):
    """The MLP after its first projection: gate_up [N, 2 * intermediate] (gate, then up) -> [N, hidden]."""
    width = gate_up.shape[-1] // 2
    if gate_up.shape[0] == 0:
        return gate_up[:, :width] @ layer["down"].T
    if gate_up.shape[0] == 1 and width <= FOLD_WIDTH and layer["down"].stride(-1) == 1:
        return swiglu_down(gate_up, layer["down"], width)
    swiglu_kernel[(gate_up.shape[0], triton.cdiv(width, SWIGLU_BLOCK))](
        gate_up, gate_up, gate_up.stride(0), gate_up.stride(0), width, BLOCK=SWIGLU_BLOCK, num_warps=SWIGLU_WARPS)
    return gate_up[:, :width] @ layer["down"].T
