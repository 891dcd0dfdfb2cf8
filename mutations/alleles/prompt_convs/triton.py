"""A Gated DeltaNet's causal conv over every prompt of a prefill (Qwen3.5) in one Triton launch.

The seed convolves each prompt apart from a zero state: per prompt and layer a zeros, a
cat, a conv, a SiLU and a transpose (16 prompts: 48 conv launches over 3 layers, 4.2 ms of
a 16 x 1,024 prefill's 120 on an H200, with as much again in copies;
docs/log/2026-11-29-hybrid-chunk-systems-in-triton.md). Here a program takes a block of
packed tokens and channels: each tap reads the token that many places back, or zero where
that is before the token's own prompt. The sum is rounded to the compute dtype before the
SiLU, as the seed's conv rounds it. Each prompt's conv state, its last kernel - 1 inputs
(zeros before its start), is gathered in torch.
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

PROMPT_CONV_TOKENS = 32  # range: 8..128; packed tokens a program takes
PROMPT_CONV_CHANNELS = 128  # range: 32..512; channels a program takes


@triton.jit
def prompt_conv_kernel(x_ptr, weight_ptr, within_ptr, out_ptr, tokens, channels, KEEP: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[n, c] = silu(sum over taps j of weight[c, j] x[n - KEEP + j, c]), a tap past the
    start of token n's prompt (within[n]: its place in it) reading zero."""
    n = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n_ok, c_ok = n < tokens, c < channels
    within = tl.load(within_ptr + n, mask=n_ok, other=0)
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(KEEP + 1):
        ok = (n_ok & (within >= KEEP - j))[:, None] & c_ok[None, :]
        x = tl.load(x_ptr + (n - (KEEP - j))[:, None] * channels + c[None, :], mask=ok, other=0.0)
        tap = tl.load(weight_ptr + c * (KEEP + 1) + j, mask=c_ok, other=0.0)
        acc += x.to(tl.float32) * tap.to(tl.float32)[None, :]
    acc = acc.to(out_ptr.dtype.element_ty).to(tl.float32)  # the seed's conv output rounding
    tl.store(out_ptr + n[:, None] * channels + c[None, :], (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty),
             mask=n_ok[:, None] & c_ok[None, :])


def prompt_convs(mixed, lin, step):
    """causal_conv over each prompt of mixed [N, conv_dim] from a zero state: (out [N,
    conv_dim], each prompt's conv state [B, conv_dim, kernel - 1])."""
    mixed = mixed.contiguous()
    tokens, channels = mixed.shape
    keep = lin["conv"].shape[-1] - 1
    lengths = torch.tensor(step.num_new)
    within = torch.cat([torch.arange(n, dtype=torch.int32) for n in step.num_new]).to(mixed.device)
    out = torch.empty_like(mixed)
    if tokens:
        grid = (triton.cdiv(tokens, PROMPT_CONV_TOKENS), triton.cdiv(channels, PROMPT_CONV_CHANNELS))
        prompt_conv_kernel[grid](mixed, lin["conv"].contiguous(), within, out, tokens, channels, KEEP=keep,
                                 BLOCK_T=PROMPT_CONV_TOKENS, BLOCK_C=PROMPT_CONV_CHANNELS)
    taps = torch.arange(keep)
    rows = lengths.cumsum(0)[:, None] - keep + taps  # [B, keep]: each prompt's last inputs
    real = (taps >= keep - lengths[:, None]).to(mixed.device)
    last = mixed[rows.clamp(min=0).to(mixed.device)]  # [B, keep, conv_dim]
    return out, torch.where(real[..., None], last, 0).transpose(1, 2).contiguous()
