"""Routing in one Triton kernel after the router's matmul: a program a token takes its logits' top k and the softmax over the k chosen.

route.fused_topk's arithmetic: softmax is monotone, so the top k of the logits are the top k
of the probabilities, and renormalised, the chosen weights are the softmax of the chosen
logits alone (not renormalised: exp(l_i - logsumexp(l))). There torch runs it as a cast,
a top-k and a softmax, three launches or more a layer; here one, with the logits read once
in fp32. Equal logits go to the lower expert id first. Only a row whose
k-th and (k+1)-th logits are within rounding can pick another expert than the seed's (the
gate's near-tie rule, fitness/reference_logits.py).
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

ROUTE_WARPS = 1  # range: 1..8; warps a program runs with: one row of a few hundred logits each


@triton.jit
def route_kernel(logits_ptr, weights_ptr, experts_ptr, num_experts, stride_l, TOP_K: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, RENORMALISE: tl.constexpr):
    """weights[t] and experts[t] (TOP_K each) from logits[t]: the top TOP_K, and their softmax
    (RENORMALISE) or their share of every expert's."""
    t = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + t * stride_l + e, mask=e < num_experts, other=float("-inf")).to(tl.float32)
    highest = tl.max(logits, 0)
    slots = tl.arange(0, BLOCK_K)
    top = tl.full([BLOCK_K], float("-inf"), tl.float32)
    chosen = tl.zeros([BLOCK_K], dtype=tl.int64)
    left = logits
    for j in tl.static_range(TOP_K):
        at = tl.argmax(left, 0, tie_break_left=True)
        top = tl.where(slots == j, tl.max(left, 0), top)
        chosen = tl.where(slots == j, at, chosen)
        left = tl.where(e == at, float("-inf"), left)
    share = tl.exp(top - highest)  # 0 past TOP_K
    if RENORMALISE:
        share = share / tl.sum(share, 0)
    else:
        share = share / tl.sum(tl.exp(logits - highest), 0)
    ok = slots < TOP_K
    tl.store(weights_ptr + t * TOP_K + slots, share.to(weights_ptr.dtype.element_ty), mask=ok)
    tl.store(experts_ptr + t * TOP_K + slots, chosen, mask=ok)


def route(x, layer, logits=None):
    """(weights [N, k] in x's dtype, experts [N, k]) for x [N, hidden]: the router's logits by
    a matmul (or the caller's), then the kernel."""
    if logits is None:
        logits = x @ layer["router"].T  # [N, E], x's dtype as the seed rounds them
    n, num_experts = logits.shape
    k = layer["top_k"]
    weights = torch.empty(n, k, device=x.device, dtype=x.dtype)
    experts = torch.empty(n, k, device=x.device, dtype=torch.long)
    if n:
        route_kernel[(n,)](logits, weights, experts, num_experts, logits.stride(0), TOP_K=k,
                           BLOCK_K=triton.next_power_of_2(k), BLOCK_E=triton.next_power_of_2(num_experts),
                           RENORMALISE=bool(layer["renormalise"]), num_warps=ROUTE_WARPS)
    return weights, experts
