"""A Gated DeltaNet's decay and write strength (Qwen3.5) in one Triton kernel: both projections and the gate math.

The seed runs two matmuls of [N, hidden] by [value heads, hidden] and eight elementwise
launches (sigmoid, casts, the bias, softplus, exp, the products) a layer: ten launches for
2 x 32 numbers a token. Here a program per token and DELTA_GATES_HEADS heads reads its row
of x, takes its dot products with those heads' rows of a and b in fp32, rounds them to x's
dtype as the seed's matmuls do, and writes log_decay = -exp(A_log) softplus(x a' + dt_bias)
and beta = sigmoid(x b') (rounded to x's dtype, as the seed's sigmoid is). The heads are
split over programs so that a decode step's few rows still make many short ones: a program
a token for every head read 256 KB of weights in eight dependent steps (about 35 us a call
at 64 rows on an H200, docs/log/2026-11-29-hybrid-tf32-prefill-gates-served-conc-64.md,
and one program at batch 1). Every row reads all the weights (2 x 128 KB on Qwen3.5): from
L2 in a decode batch; in a long prefill about a millisecond a layer, beside the tens the
layer takes.
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

DELTA_GATES_HEADS = 2  # range: 1..32; value heads a program takes (programs: rows x heads / this)
DELTA_GATES_BLOCK = 2048  # range: 64..8192; hidden dims a step of the dot products takes


@triton.jit
def delta_gates_kernel(x_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, decay_ptr, beta_ptr, hidden, heads,
                       BLOCK_H: tl.constexpr, BLOCK: tl.constexpr):
    """decay[n] and beta[n] of BLOCK_H heads (fp32) from x[n] [hidden] and a, b [heads, hidden]."""
    n = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < heads
    dot_a = tl.zeros([BLOCK_H], dtype=tl.float32)
    dot_b = tl.zeros([BLOCK_H], dtype=tl.float32)
    for start in range(0, hidden, BLOCK):
        d = start + tl.arange(0, BLOCK)
        d_ok = d < hidden
        x = tl.load(x_ptr + n * hidden + d, mask=d_ok, other=0.0).to(tl.float32)
        rows = h[:, None] * hidden + d[None, :]
        ok = h_ok[:, None] & d_ok[None, :]
        dot_a += tl.sum(tl.load(a_ptr + rows, mask=ok, other=0.0).to(tl.float32) * x[None, :], 1)
        dot_b += tl.sum(tl.load(b_ptr + rows, mask=ok, other=0.0).to(tl.float32) * x[None, :], 1)
    dtype = x_ptr.dtype.element_ty
    dot_a = dot_a.to(dtype).to(tl.float32) + tl.load(dt_bias_ptr + h, mask=h_ok, other=0.0)
    softplus = tl.where(dot_a > 20.0, dot_a, tl.log(1.0 + tl.exp(dot_a)))  # torch's threshold
    decay = -tl.exp(tl.load(a_log_ptr + h, mask=h_ok, other=0.0)) * softplus
    beta = tl.sigmoid(dot_b.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(decay_ptr + n * heads + h, decay, mask=h_ok)
    tl.store(beta_ptr + n * heads + h, beta, mask=h_ok)


def delta_gates(x, lin):
    """The seed's (log_decay, beta) [N, value heads], fp32."""
    rows, hidden = x.shape
    heads = lin["a"].shape[0]
    decay = torch.empty(rows, heads, device=x.device, dtype=torch.float32)
    beta = torch.empty_like(decay)
    block_h = min(DELTA_GATES_HEADS, triton.next_power_of_2(heads))
    if rows:
        delta_gates_kernel[(rows, triton.cdiv(heads, block_h))](
            x.contiguous(), lin["a"], lin["b"], lin["A_log"], lin["dt_bias"], decay, beta, hidden, heads,
            BLOCK_H=block_h, BLOCK=min(DELTA_GATES_BLOCK, triton.next_power_of_2(hidden)))
    return decay, beta
