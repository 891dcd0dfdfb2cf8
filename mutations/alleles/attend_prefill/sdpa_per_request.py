"""Causal SDPA over each prompt alone: the fused attention kernel instead of explicit scores."""
import torch
import torch.nn.functional as F

REQUIRES = {}
DEVICES = "any"


def attend_prefill(q, k, v, cache, layer, step):
    """Causal attention over each prompt alone: q [N, heads, D] -> [N, heads*D]."""
    outs = []
    for q_r, k_r, v_r in zip(q.split(step.num_new), k.split(step.num_new), v.split(step.num_new)):
        # SDPA softmaxes in fp32 inside its kernel; it differs from the reference by rounding.
        out = F.scaled_dot_product_attention(q_r.transpose(0, 1)[None], k_r.transpose(0, 1)[None],
                                             v_r.transpose(0, 1)[None], is_causal=True,
                                             enable_gqa=True)  # [1, heads, t, D]
        outs.append(out[0].transpose(0, 1).flatten(1))  # [t, heads*D]
    return torch.cat(outs)
