"""SwiGLU as the epilogue of the gate/up matmul for a few rows: one kernel, no [N, 2 x intermediate] round trip.

At a decode batch of a few dozen rows mlp.swiglu_triton runs gate/up through cuBLAS and then
its SwiGLU kernel, a launch of its own that reads both halves back. Here (shared.py's
glu_kernel) each program owns GLU_BLOCK_N columns of both halves (gate rows, then up rows of
the fused weight), walks the inner dimension in GLU_BLOCK_K tiles on the tensor cores, rounds
each product to the compute dtype as a matmul's output is rounded, and writes silu(gate) * up
with swiglu_kernel's arithmetic (silu_times). Timed alone on an H100 in bf16
(tools.probes.glu_matmul_bench, docs/log/2026-11-27-glu-matmul-epilogue.md), against cuBLAS +
the SwiGLU kernel, us a call:
Llama-3.2-1B
8 rows 25.5 against 27.8, 64 rows 27.2 against 29.7; Qwen3-0.6B 7.7 / 8.4 against 8.9 / 9.3;
the 1B-class GQA target 18.8 / 20.6 against 21.0 / 21.9. One row keeps swiglu_triton's fold
into the down projection, a prefill's thousands of rows cuBLAS; fp32 keeps the reference's
matmul (a tensor-core dot in fp32 rounds through tf32).
"""
import torch
import triton

REQUIRES = {"load_weights": ("fused_gate_up", "fused_both")}
DEVICES = "cuda"

GLU_ROWS = 64  # range: 2..256; the most rows whose gate/up product takes the SwiGLU epilogue

GLU_BLOCK_N = 32  # range: 16..128; columns of each half a program owns

GLU_BLOCK_K = 128  # range: 32..256; inner-dimension elements a step of its loop reads

GLU_STAGES = 3  # range: 1..5, step 1; software-pipelining stages of its loop

GLU_WARPS = 4  # range: 1..16; warps a program runs with (Triton's default: 4)


def takes_glu(x, gate_up):
    """Whether glu_matmul takes x: 2 to GLU_ROWS rows of fp16 or bf16, the weight alike."""
    return (x.dim() == 2 and 2 <= x.shape[0] <= GLU_ROWS and x.dtype in (torch.float16, torch.bfloat16)
            and gate_up.dtype == x.dtype and x.stride(-1) == 1 and gate_up.stride(-1) == 1)


def glu_matmul(x, gate_up):
    """silu(x @ gate.T) * (x @ up.T) [M, intermediate] of x [M, K] and the fused gate/up weight [2 x intermediate, K]."""
    width = gate_up.shape[0] // 2
    out = torch.empty(x.shape[0], width, device=x.device, dtype=x.dtype)
    glu_kernel[(triton.cdiv(width, GLU_BLOCK_N),)](
        x, gate_up, gate_up[width:], out, x.shape[0], width, x.shape[1], x.stride(0), gate_up.stride(0),
        gate_up.stride(0), out.stride(0),
        BLOCK_M=max(16, triton.next_power_of_2(x.shape[0])), BLOCK_N=GLU_BLOCK_N, BLOCK_K=GLU_BLOCK_K,
        num_warps=GLU_WARPS, num_stages=GLU_STAGES)
    return out


def mlp(x, layer):
    if takes_glu(x, layer["gate_up"]):
        product = glu_matmul(x, layer["gate_up"])
        return product @ layer["down"].T
    return swiglu(x @ layer["gate_up"].T, layer)
