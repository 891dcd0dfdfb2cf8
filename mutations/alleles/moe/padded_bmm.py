"""Every expert over a block of N rows: the pairs scattered into [E, N, hidden], one bmm per projection by the stacked weights.

A token goes to an expert at most once, so no expert gets more than N of a call's N tokens:
a block of N rows per expert holds every pair at (its expert, its rank among that expert's
pairs), the rest zeros (silu(0) * 0 = 0: padding adds nothing). The shapes depend on N
alone and nothing comes back to the host, so a captured decode graph can hold it, at any
batch. It multiplies E x N rows where the pairs are N x k, and reads every expert's weights:
worth it where a step reads most experts anyway (a decode batch of dozens on Qwen3-30B-A3B,
top 8 of 128) or is bound by launches, not where few pairs reach few experts. Past
PADDED_MOE_ROWS rows (E x N) it takes the seed's sorted path, whose memory is the pairs'.
"""
import torch
import torch.nn.functional as F

REQUIRES = {}
DEVICES = "any"

PADDED_MOE_ROWS = 1024  # range: 64..65536; the most expert rows (experts x tokens) a sparse layer pads to


def padded_experts(x, weights, experts, order, counts, layer):
    """The router-weighted sum of each token's experts' SwiGLU, x [N, hidden] -> [N, hidden],
    with every expert over N rows; order and counts as dispatch gives them."""
    n, k = experts.shape
    chosen = experts.flatten()  # [N*k]
    starts = counts.cumsum(0) - counts  # [E]: where each expert's pairs start in `order`
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device) - starts[chosen[order]]  # < N
    block = x.new_zeros(counts.shape[0], n, x.shape[1])  # [E, N, hidden]
    block[chosen, rank] = x.repeat_interleave(k, dim=0)
    hidden = F.silu(torch.bmm(block, layer["experts_gate"].transpose(1, 2))) \
        * torch.bmm(block, layer["experts_up"].transpose(1, 2))  # [E, N, inter]
    outs = torch.bmm(hidden, layer["experts_down"].transpose(1, 2))[chosen, rank]  # [N*k, hidden]
    return (outs.view(n, k, -1) * weights[:, :, None]).sum(1)


def moe(x, layer):
    """A sparse layer's MLP over x [N, hidden]: route, dispatch, then every expert over N
    padded rows (a few rows), else each expert's SwiGLU over its own and combine."""
    weights, experts = route(x, layer)
    order, counts = dispatch(experts, layer["router"].shape[0])
    if counts.shape[0] * x.shape[0] <= PADDED_MOE_ROWS:
        return padded_experts(x, weights, experts, order, counts, layer)
    rows = x[order // experts.shape[1]]  # [N*k, hidden]: each token once per expert it goes to
    return combine(experts_swiglu(rows, counts, layer), order, weights)
