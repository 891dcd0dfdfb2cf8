"""K/V gathered through the cache's block table, masked past each request's length, one SDPA.

Static shapes: the gather reads every page the table names, so the call captures in a CUDA
graph. Needs a cache that addresses K/V by page (the slab is one page per request).
"""
import torch
import torch.nn.functional as F

REQUIRES = {"KVCache": ("slab", "paged")}
DEVICES = "any"


def attend_decode(q, k, v, cache, layer, step):
    """Each request's one query over the pages of its block table: q [B, heads, D] -> [B, heads*D]."""
    keys = cache.k[layer][step.block_table].flatten(1, 2)  # [B, pages*page_size, kv_heads, D]
    values = cache.v[layer][step.block_table].flatten(1, 2)
    # The new token sits at `positions`; everything after it is another request's or stale.
    valid = torch.arange(keys.shape[1], device=q.device)[None, :] <= step.positions[:, None]  # [B, L]
    out = F.scaled_dot_product_attention(q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=valid[:, None, None, :],
                                         enable_gqa=True)  # [B, heads, 1, D]
    return out.flatten(1)
