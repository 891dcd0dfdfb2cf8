"""Routing in one pass over the router logits: their top k, then a softmax over the k chosen.

softmax is monotone, so the top k of the logits are the top k of the probabilities; and
renormalised, p_i / (sum of the chosen p_j) is exp(l_i) / (sum of the chosen exp(l_j)), the
softmax of the chosen logits alone. Without renormalisation a chosen weight is
exp(l_i - logsumexp(l)). Either way the [N, E] probabilities are never written or sorted:
top-k reads the logits once, and the softmax runs over k columns, not E. The same
function as the seed's in exact arithmetic; in fp32 it differs by rounding, and only a row
whose k-th and (k+1)-th logits are within rounding can pick another expert (the gate's
near-tie rule, fitness/reference_logits.py).
"""
import torch

REQUIRES = {}
DEVICES = "any"


def route(x, layer, logits=None):
    """(weights [N, k] in x's dtype, experts [N, k]) for x [N, hidden]: the top k logits, and
    their softmax (renormalised) or their share of every expert's (not). logits: the router's,
    where the caller made them."""
    logits = (x @ layer["router"].T if logits is None else logits).float()  # [N, E]
    top, experts = torch.topk(logits, layer["top_k"], dim=-1)  # [N, k] each
    if layer["renormalise"]:
        weights = torch.softmax(top, dim=-1)
    else:
        weights = torch.exp(top - torch.logsumexp(logits, dim=-1, keepdim=True))
    return weights.to(x.dtype), experts
