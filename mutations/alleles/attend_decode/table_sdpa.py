"""K/V gathered through the cache's block table, masked past each request's length, one SDPA.

Static shapes: the gather reads every page the table names, so the call captures in a CUDA
graph. Needs a cache that addresses K/V by page (the slab is one page per request).
"""
REQUIRES = {"KVCache": ("slab", "paged")}
DEVICES = "any"


def attend_decode(q, k, v, cache, layer, step):
    """Each request's one query over the pages of its block table: q [B, heads, D] -> [B, heads*D]."""
    return table_attention(q, cache, layer, step)
