"""Routing in one Triton kernel after the router's matmul: a program a token takes its logits' top k and the softmax over the k chosen.

route.fused_topk's arithmetic: softmax is monotone, so the top k of the logits are the top k
of the probabilities, and renormalised, the chosen weights are the softmax of the chosen
logits alone (not renormalised: exp(l_i - logsumexp(l))). There torch runs it as a cast,
a top-k and a softmax, three launches or more a layer; here one, with the logits read once
in fp32. Equal logits go to the lower expert id first. Only a row whose
k-th and (k+1)-th logits are within rounding can pick another expert than the seed's (the
gate's near-tie rule, fitness/reference_logits.py).

A call of up to ROUTER_ROWS rows computes the logits in a kernel too, ROUTER_EXPERTS experts a
program, each logit rounded to x's dtype as the matmul rounds it; the last program to finish
takes every row's top k. One launch, not cuBLAS's matmul and the top-k kernel: at batch 1 on
Qwen3-30B-A3B those took 5.4 and 2.4 us of a ~60 us layer for 0.5 MB
(docs/log/2026-11-30-moe-search-two-gpus-batch-1-timeline.md).
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

ROUTE_WARPS = 1  # range: 1..8; warps a program runs with: one row of a few hundred logits each
ROUTER_ROWS = 0  # range: 0..64; calls of up to this many rows compute the logits in the kernel (0: never)
ROUTER_EXPERTS = 8  # range: 1..64; experts whose logits a program computes then (a power of two above)
ROUTER_BLOCK_H = 512  # range: 64..4096; hidden elements a step of its loop reads
ROUTER_WARPS = 4  # range: 1..16; warps such a program runs with


@triton.jit
def take_top_k(logits, e, row, weights_ptr, experts_ptr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
               RENORMALISE: tl.constexpr):
    """weights[row] and experts[row] (TOP_K each) from the row's fp32 logits (-inf past the
    experts): the top TOP_K, and their softmax (RENORMALISE) or their share of every expert's."""
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
    tl.store(weights_ptr + row * TOP_K + slots, share.to(weights_ptr.dtype.element_ty), mask=ok)
    tl.store(experts_ptr + row * TOP_K + slots, chosen, mask=ok)


@triton.jit
def route_kernel(logits_ptr, weights_ptr, experts_ptr, num_experts, stride_l, TOP_K: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, RENORMALISE: tl.constexpr):
    """take_top_k of row t's logits, t this program."""
    t = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + t * stride_l + e, mask=e < num_experts, other=float("-inf")).to(tl.float32)
    take_top_k(logits, e, t, weights_ptr, experts_ptr, TOP_K, BLOCK_K, RENORMALISE)


@triton.jit
def router_kernel(x_ptr, router_ptr, logits_ptr, weights_ptr, experts_ptr, ticket_ptr, num_rows, num_experts,
                  hidden, stride_x, stride_r, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, RENORMALISE: tl.constexpr):
    """logits[t, r] = x[t] @ router[r] rounded to x's dtype, for every row t and this program's
    BLOCK_R experts r; then, once every program has counted itself in at the ticket (releasing
    its logits; the last acquires them all), the last takes each row's top k and sets the
    ticket back to 0."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < num_experts
    dtype = x_ptr.dtype.element_ty
    for t in range(0, num_rows):
        acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        for h0 in range(0, hidden, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            h_ok = h < hidden
            x = tl.load(x_ptr + t * stride_x + h, mask=h_ok, other=0.0).to(tl.float32)
            w = tl.load(router_ptr + r[:, None].to(tl.int64) * stride_r + h[None, :],
                        mask=r_ok[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * x[None, :], 1)
        tl.store(logits_ptr + t * num_experts + r, acc.to(dtype).to(tl.float32), mask=r_ok)
    arrived = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        e = tl.arange(0, BLOCK_E)
        for t in range(0, num_rows):  # L2, not a stale L1: the logits are other programs' stores
            logits = tl.load(logits_ptr + t * num_experts + e, mask=e < num_experts, other=float("-inf"),
                             cache_modifier=".cg")
            take_top_k(logits, e, t, weights_ptr, experts_ptr, TOP_K, BLOCK_K, RENORMALISE)
        tl.atomic_xchg(ticket_ptr, 0)


def route(x, layer):
    """(weights [N, k] in x's dtype, experts [N, k]) for x [N, hidden]: the router's logits by
    a matmul, then the kernel (or, up to ROUTER_ROWS rows, both in router_kernel)."""
    router, k, n = layer["router"], layer["top_k"], x.shape[0]
    num_experts = router.shape[0]
    weights = torch.empty(n, k, device=x.device, dtype=x.dtype)
    experts = torch.empty(n, k, device=x.device, dtype=torch.long)
    if not n:
        return weights, experts
    shape = dict(TOP_K=k, BLOCK_K=triton.next_power_of_2(k), BLOCK_E=triton.next_power_of_2(num_experts),
                 RENORMALISE=bool(layer["renormalise"]))
    if n <= ROUTER_ROWS and x.stride(-1) == 1 and router.stride(-1) == 1:
        logits = torch.empty(n, num_experts, device=x.device, dtype=torch.float32)
        block_r = triton.next_power_of_2(ROUTER_EXPERTS)
        router_kernel[(triton.cdiv(num_experts, block_r),)](
            x, router, logits, weights, experts, tickets(x.device, "router", 1), n, num_experts, x.shape[1],
            x.stride(0), router.stride(0), BLOCK_R=block_r, BLOCK_H=ROUTER_BLOCK_H, num_warps=ROUTER_WARPS, **shape)
        return weights, experts
    logits = x @ router.T  # [N, E], x's dtype as the seed rounds them
    route_kernel[(n,)](logits, weights, experts, num_experts, logits.stride(0), num_warps=ROUTE_WARPS, **shape)
    return weights, experts
