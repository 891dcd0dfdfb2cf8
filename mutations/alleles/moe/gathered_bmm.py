"""A few tokens' experts by batched matmul: each (token, expert) pair's weights gathered from the stacked [E, ...] tensors.

At a decode step a sparse layer has a handful of (token, expert) pairs. The seed sorts them,
reads the counts back to the host and runs a loop of three matmuls per expert; here, up to
MOE_GATHER_ROWS pairs, each pair's three weight matrices are gathered from the experts'
stacked weights (read_checkpoint stacks them at load) and one torch.bmm per projection
computes every pair at once: three bmm launches and three gathers a layer whatever the
experts, no sort, and no value read back to the host (a captured decode graph should hold
it; not yet tried on a GPU). The gather copies each
pair's weights once, so it pays only at few rows: more pairs take the seed's sorted path.
Triton grouped-GEMM alleles, which would read each expert's weights in place, belong beside
this one (alleles/moe/, DEVICES = "cuda").
"""
import torch
import torch.nn.functional as F

REQUIRES = {}
DEVICES = "any"

MOE_GATHER_ROWS = 16  # range: 1..1024; the most (token, expert) pairs a sparse layer computes by gathered bmm


def gathered_experts(x, weights, experts, layer):
    """The router-weighted sum of each token's experts' SwiGLU: x [N, hidden], weights and
    experts [N, k] -> [N, hidden], by one bmm per projection over the N*k pairs."""
    n, k = experts.shape
    chosen = experts.flatten()  # [N*k]: token t's experts at rows t*k .. t*k + k - 1
    rows = x[:, None, :].expand(n, k, x.shape[1]).reshape(n * k, 1, -1)  # [N*k, 1, hidden]: token t's at t*k..
    gate = torch.bmm(rows, layer["experts_gate"][chosen].transpose(1, 2))  # [N*k, 1, inter]
    up = torch.bmm(rows, layer["experts_up"][chosen].transpose(1, 2))
    outs = torch.bmm(F.silu(gate) * up, layer["experts_down"][chosen].transpose(1, 2))  # [N*k, 1, hidden]
    return (outs.view(n, k, -1) * weights[:, :, None]).sum(1)  # [N, hidden]


def moe(x, layer, logits=None):
    """A sparse layer's MLP over x [N, hidden]: route, then gathered bmm for a few pairs, else
    dispatch, each expert's SwiGLU, combine. logits: the router's, where the caller made them
    (route's)."""
    weights, experts = route(x, layer, logits)
    if experts.numel() <= MOE_GATHER_ROWS:
        return plus_shared_expert(gathered_experts(x, weights, experts, layer), x, layer)
    return plus_shared_expert(sorted_experts(x, weights, experts, layer), x, layer)
