"""Causal SDPA over each prompt alone: the fused attention kernel instead of explicit scores."""
REQUIRES = {}
DEVICES = "any"


def attend_prefill(q, k, v, cache, layer, step):
    """Causal attention over each prompt alone: q [N, heads, D] -> [N, heads*D]."""
    return per_request_attention(q, k, v, step.num_new)
