"""Every expert over a block of N rows: the pairs scattered into [E, N, hidden], one bmm per projection by the stacked weights.

A token goes to an expert at most once, so no expert gets more than N of a call's N tokens:
a block of N rows per expert holds every pair at (its expert, its rank among that expert's
pairs in token order), the rest zeros (silu(0) * 0 = 0: padding adds nothing). The shapes
depend on N alone and no op reads a value back to the host (ranks by a comparison and a
cumulative sum, not dispatch: torch.bincount on CUDA reads its input's min and max back to
check it and size its output), so a captured decode graph should hold it at any batch (not
yet tried on a GPU).
It multiplies E x N rows where the pairs are N x k, and reads every expert's weights: worth
it where a step reads most experts anyway (a decode batch of dozens on Qwen3-30B-A3B, top 8
of 128) or is bound by launches, not where few pairs reach few experts. Past
PADDED_MOE_ROWS rows (E x N) it takes the seed's sorted path, whose memory is the pairs'.
"""
import torch
import torch.nn.functional as F

REQUIRES = {}
DEVICES = "any"

PADDED_MOE_ROWS = 1024  # range: 64..65536; the most expert rows (experts x tokens) a sparse layer pads to


def padded_experts(x, weights, experts, layer):
    """The router-weighted sum of each token's experts' SwiGLU, x [N, hidden] -> [N, hidden],
    with every expert over N rows."""
    n, k = experts.shape
    num_experts = layer["router"].shape[0]
    chosen = experts.flatten()  # [N*k]
    hits = (chosen[:, None] == torch.arange(num_experts, device=x.device)).long()  # [N*k, E]
    rank = hits.cumsum(0).gather(1, chosen[:, None])[:, 0] - 1  # [N*k]: earlier pairs of its expert, < N
    block = x.new_zeros(num_experts, n, x.shape[1])  # [E, N, hidden]
    block[chosen, rank] = x[:, None, :].expand(n, k, x.shape[1]).reshape(n * k, -1)  # pair t*k + j is token t's
    hidden = F.silu(torch.bmm(block, layer["experts_gate"].transpose(1, 2))) \
        * torch.bmm(block, layer["experts_up"].transpose(1, 2))  # [E, N, inter]
    outs = torch.bmm(hidden, layer["experts_down"].transpose(1, 2))[chosen, rank]  # [N*k, hidden]
    return (outs.view(n, k, -1) * weights[:, :, None]).sum(1)


def moe(x, layer, logits=None):
    """A sparse layer's MLP over x [N, hidden]: route, then every expert over N padded rows
    (few rows), else dispatch, each expert's SwiGLU over its own rows, combine. logits: the
    router's, where the caller made them (route's)."""
    weights, experts = route(x, layer, logits)
    if layer["router"].shape[0] * x.shape[0] <= PADDED_MOE_ROWS:
        return plus_shared_expert(padded_experts(x, weights, experts, layer), x, layer)
    return plus_shared_expert(sorted_experts(x, weights, experts, layer), x, layer)
