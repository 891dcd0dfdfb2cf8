"""Helpers several alleles share. A swap pulls in those a program names (after the
allele's own file, before the seed's); nothing here is a gene."""
import torch
import torch.nn.functional as F


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


def per_request_attention(q, k, v, num_new):
    """Causal attention over each packed prompt alone: q [N, heads, D] -> [N, heads*D]."""
    outs = []
    for q_r, k_r, v_r in zip(q.split(num_new), k.split(num_new), v.split(num_new)):
        out = sdpa(q_r.transpose(0, 1)[None], k_r.transpose(0, 1)[None], v_r.transpose(0, 1)[None],
                   is_causal=True)  # [1, heads, t, D]
        outs.append(out[0].transpose(0, 1).flatten(1))  # [t, heads*D]
    return torch.cat(outs)
