"""Helpers several alleles share. A swap pulls in those a program names (after the
allele's own file, before the seed's); nothing here is a gene."""
import os

import torch
import torch.nn.functional as F

MAX_GRAPH_BATCH = 64  # range: 8..256, fits: decode_batch; the largest batch a decode graph is captured for
GRAPH_BUCKET_STEP = 16  # range: 4..64; decode graphs above batch 8 are captured every this many
# The longest request a decode graph serves; longer ones decode eagerly. A graph's block
# table is this wide whatever a step holds, and attention that reads the whole table
# (table_sdpa) pays for all of it: as wide as max_position_embeddings, Llama 3.2's 131,072
# positions put a 64 GiB allocation in the batch-64 graph (docs/PERF.md). The split-KV
# kernel reads live pages only: for it this bounds the static table, and doubling it costs
# little.
GRAPH_MAX_POSITIONS = 8192  # range: 256..131072
# The same in the contract's bf16, where table_sdpa rounds like its reference with masked
# math over the whole table at every captured step (all 6,000 positions of the public
# config's, docs/PERF.md). The split-KV kernel reads live pages there too, but the graphs
# cannot tell which attention a program has.
ROUNDED_GRAPH_POSITIONS = 1024  # range: 128..8192
ROPE_WARPS = 4  # range: 1..16; warps a program runs with (Triton's default: 4)


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


def rotate_pairs(x, cos, sin):
    """The reference's rotation, op for op."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def launch_rope(kernel, x, cos, sin):
    """x [N, heads, head_dim] rotated by a Triton RoPE kernel, one program a token (the
    `apply_rope` alleles' kernels take the same arguments); bf16 with bf16 tables (the
    contract's) takes the reference's own ops (apply_rope.triton says why), a checkpoint's
    fp32 tables the kernel. Powers of two without triton: CPU programs read this file."""
    if x.dtype == torch.bfloat16 and cos.dtype == torch.bfloat16:
        return rotate_pairs(x, cos, sin)
    num_tokens, num_heads, head_dim = x.shape
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    if num_tokens == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    kernel[(num_tokens,)](x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), out.stride(0), out.stride(1),
                          num_heads, HALF=head_dim // 2, BLOCK_H=1 << (num_heads - 1).bit_length(),
                          BLOCK_P=1 << (head_dim // 2 - 1).bit_length(), num_warps=ROPE_WARPS)
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
