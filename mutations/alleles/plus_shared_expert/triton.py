"""The shared expert (Qwen3.5) in two Triton kernels at a decode's few rows: gate and up with SwiGLU in the epilogue, then down with the sigmoid gate and the add in its epilogue.

The seed runs it as nine launches a sparse layer: the projections of x by gate, up and the
expert's gate, silu, the product, the down projection, sigmoid, the product and the sum. On
the tiny hybrid that is 9 of the 28 kernels a layer's batch-1 decode launches (counted by
`python -m tools.probes.kernel_count`), and a batch-1 step of Qwen3.5-35B-A3B's shape is
launch-bound: 7.67 ms against a bound of 1.40
(docs/log/2026-11-29-hybrid-tf32-prefill-gates-served-conc-64.md).

Here the first kernel is mlp.glu_matmul's (shared.py's glu_kernel), over the two weights as
the checkpoint holds them (no stacked copy). A program of the second owns GATED_BLOCK_N
output columns of every row: the down product on the tensor cores, rounded as a matmul's
output is; each row's gate x . w in fp32, rounded the same way; sigmoid as CUDA's computes it
(expf, an IEEE division), rounded; its product with the expert's output, rounded (mul_rn: not
fused into the add); plus `out`, rounded: the seed's ops, one rounding each. Past SHARED_ROWS
rows (a prefill) and in fp32 (a tensor-core dot rounds fp32 through tf32) the seed's matmuls.
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

SHARED_ROWS = 64  # range: 1..256; the most rows whose shared expert takes the two kernels
GATED_BLOCK_N = 32  # range: 16..256; output columns a program of the down kernel owns
GATED_BLOCK_K = 128  # range: 32..512; inner-dimension elements a step of its loops reads
GATED_WARPS = 4  # range: 1..16; warps a program of the down kernel runs with
GATED_STAGES = 3  # range: 1..5, step 1; software-pipelining stages of its loops


@triton.jit
def gated_down_kernel(product_ptr, down_ptr, x_ptr, gate_w_ptr, out_ptr, result_ptr, num_rows, hidden, width,
                      stride_p, stride_d, stride_x, stride_o, stride_r,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """result[:, cols] = out + sigmoid(x @ gate_w) * (product @ down[cols].T), each op rounded
    to the output's dtype as the seed's torch ops round it."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok, col_ok = rows < num_rows, cols < hidden
    down_rows = down_ptr + cols[:, None].to(tl.int64) * stride_d
    shared = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, width, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < width
        p = tl.load(product_ptr + rows[:, None] * stride_p + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        shared += tl.dot(p, tl.trans(tl.load(down_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)))
    gate = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)  # each row's x . gate_w, every program alike
    for k0 in range(0, hidden, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < hidden
        x = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        gate += x.to(tl.float32) * tl.load(gate_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
    dtype = result_ptr.dtype.element_ty
    logit = tl.sum(gate, axis=1).to(dtype).to(tl.float32)
    weight = tl.math.div_rn(1.0, 1.0 + EXP.exp(-logit)).to(dtype).to(tl.float32)
    gated = ROUNDED.mul_rn(weight[:, None], shared.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    mask = row_ok[:, None] & col_ok[None, :]
    before = tl.load(out_ptr + rows[:, None] * stride_o + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(result_ptr + rows[:, None] * stride_r + cols[None, :], (before + gated).to(dtype), mask=mask)


def takes_shared_kernels(x, layer) -> bool:
    """1 to SHARED_ROWS rows of fp16 or bf16, the weights alike and their rows contiguous."""
    weights = [layer[name] for name in ("shared_gate", "shared_up", "shared_down", "shared_expert_gate")]
    return (x.dim() == 2 and 1 <= x.shape[0] <= SHARED_ROWS and x.dtype in (torch.float16, torch.bfloat16)
            and x.stride(-1) == 1 and all(w.dtype == x.dtype and w.stride(-1) == 1 for w in weights))


def plus_shared_expert(out, x, layer):
    """The experts' output `out` [N, hidden] plus, where the layer has one (Qwen3.5), the
    shared expert's SwiGLU of x [N, hidden] behind its sigmoid gate."""
    if "shared_expert_gate" not in layer:
        return out
    if not (takes_shared_kernels(x, layer) and out.dtype == x.dtype and out.stride(-1) == 1):
        shared = (F.silu(x @ layer["shared_gate"].T) * (x @ layer["shared_up"].T)) @ layer["shared_down"].T
        return out + torch.sigmoid(x @ layer["shared_expert_gate"].T) * shared
    rows, hidden = x.shape
    gate_w, up_w, down = layer["shared_gate"], layer["shared_up"], layer["shared_down"]
    width = gate_w.shape[0]
    block_m = max(16, triton.next_power_of_2(rows))
    product = torch.empty(rows, width, device=x.device, dtype=x.dtype)
    glu_kernel[(triton.cdiv(width, GATED_BLOCK_N),)](
        x, gate_w, up_w, product, rows, width, hidden, x.stride(0), gate_w.stride(0), up_w.stride(0),
        product.stride(0), BLOCK_M=block_m, BLOCK_N=GATED_BLOCK_N, BLOCK_K=GATED_BLOCK_K, num_warps=GATED_WARPS,
        num_stages=GATED_STAGES)
    result = torch.empty(rows, hidden, device=x.device, dtype=x.dtype)
    gated_down_kernel[(triton.cdiv(hidden, GATED_BLOCK_N),)](
        product, down, x, layer["shared_expert_gate"], out, result, rows, hidden, width, product.stride(0),
        down.stride(0), x.stride(0), out.stride(0), result.stride(0), BLOCK_M=block_m, BLOCK_N=GATED_BLOCK_N,
        BLOCK_K=GATED_BLOCK_K, num_warps=GATED_WARPS, num_stages=GATED_STAGES)
    return result
