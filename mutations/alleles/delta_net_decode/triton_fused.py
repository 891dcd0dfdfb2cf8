"""A Gated DeltaNet's decode step (Qwen3.5) in two Triton kernels that update the states in their slots.

The seed gathers each request's conv state and delta-rule matrix, runs the conv and the
rule's step in torch (the matrix [heads, key dim, value dim] in fp32 read and written four
times: decay, recall, update, read-out), and scatters both back. Here:
- conv_step: a program per request and block of channels; the conv over the slot's kernel - 1
  inputs and the new one, SiLU, and the slot's inputs shifted by one, in place;
- delta_step: a program per request, value head and block of value columns; q and k
  normalised in the program, then the matrix block loaded once, decayed, recalled from,
  updated and read out, and stored back to its slot: one read and one write of the state.
Padding rows of a decode graph share the scratch slot 0, whose contents nobody reads.
The arithmetic is the seed's in fp32; the conv's output is rounded to the compute dtype
as the seed's bf16 conv rounds it.
"""
import torch
import triton
import triton.language as tl

REQUIRES = {"RecurrentState": ("slots",)}
DEVICES = "cuda"

DELTA_BLOCK_V = 32  # range: 8..128; value columns a delta_step program keeps (a [key dim, BLOCK_V] fp32 block)
DELTA_WARPS = 4  # range: 1..8
CONV_BLOCK = 256  # range: 64..1024; channels a conv_step program takes


@triton.jit
def conv_step_kernel(x_ptr, state_ptr, weight_ptr, slot_ptr, out_ptr, channels,
                     KEEP: tl.constexpr, BLOCK: tl.constexpr):
    """out[b] = silu(conv of the slot's KEEP inputs and x[b]); the slot keeps the last KEEP."""
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < channels
    state = state_ptr + tl.load(slot_ptr + b) * channels * KEEP + c * KEEP
    x = tl.load(x_ptr + b * channels + c, mask=ok, other=0.0)
    acc = x.to(tl.float32) * tl.load(weight_ptr + c * (KEEP + 1) + KEEP, mask=ok, other=0.0).to(tl.float32)
    for j in tl.static_range(KEEP):
        past = tl.load(state + j, mask=ok, other=0.0)  # read before the shift below overwrites it
        acc += past.to(tl.float32) * tl.load(weight_ptr + c * (KEEP + 1) + j, mask=ok, other=0.0).to(tl.float32)
        if j > 0:
            tl.store(state + j - 1, past, mask=ok)
    tl.store(state + KEEP - 1, x, mask=ok)
    acc = acc.to(out_ptr.dtype.element_ty).to(tl.float32)  # the seed's conv output rounding
    tl.store(out_ptr + b * channels + c, (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def delta_step_kernel(mixed_ptr, decay_ptr, beta_ptr, matrix_ptr, slot_ptr, out_ptr, channels, heads, key_heads,
                      scale, KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_V: tl.constexpr):
    """out[b, h, block] = q' S after S = exp(g) S + k (beta (v - S'k))', S the slot's matrix block."""
    b, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kh = h // (heads // key_heads)
    dk = tl.arange(0, BLOCK_K)
    dv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok, v_ok = dk < KEY_DIM, dv < VALUE_DIM
    row = mixed_ptr + b * channels
    q = tl.load(row + kh * KEY_DIM + dk, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(row + (key_heads + kh) * KEY_DIM + dk, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(row + 2 * key_heads * KEY_DIM + h * VALUE_DIM + dv, mask=v_ok, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    g = tl.load(decay_ptr + b * heads + h)
    beta = tl.load(beta_ptr + b * heads + h)
    block = matrix_ptr + (tl.load(slot_ptr + b) * heads + h) * KEY_DIM * VALUE_DIM + dk[:, None] * VALUE_DIM + dv[None, :]
    ok = k_ok[:, None] & v_ok[None, :]
    state = tl.load(block, mask=ok, other=0.0) * tl.exp(g)
    recalled = tl.sum(k[:, None] * state, 0)
    state += k[:, None] * ((v - recalled) * beta)[None, :]
    tl.store(block, state, mask=ok)
    tl.store(out_ptr + (b * heads + h) * VALUE_DIM + dv, tl.sum(q[:, None] * state, 0), mask=v_ok)


def delta_net_decode(mixed, log_decay, beta, lin, states, step, index):
    """The seed's decode step: [B, value heads, value dim] (fp32) from mixed [B, conv_dim],
    log_decay and beta [B, value heads]; the slots' states carried on in place."""
    batch, channels = mixed.shape
    heads, key_dim, value_dim = lin["value_heads"], lin["key_dim"], lin["value_dim"]
    conv_pool, matrix_pool = states.conv[index], states.matrix[index]
    slots = step.state_slots
    mixed = mixed.contiguous()
    conv_out = torch.empty_like(mixed)
    conv_step_kernel[(batch, triton.cdiv(channels, CONV_BLOCK))](
        mixed, conv_pool, lin["conv"], slots, conv_out, channels, KEEP=conv_pool.shape[-1], BLOCK=CONV_BLOCK)
    out = torch.empty(batch, heads, value_dim, device=mixed.device, dtype=torch.float32)
    block_v = min(DELTA_BLOCK_V, triton.next_power_of_2(value_dim))
    delta_step_kernel[(batch, heads, triton.cdiv(value_dim, block_v))](
        conv_out, log_decay.float().contiguous(), beta.float().contiguous(), matrix_pool, slots, out, channels,
        heads, lin["key_heads"], key_dim ** -0.5, KEY_DIM=key_dim, VALUE_DIM=value_dim,
        BLOCK_K=triton.next_power_of_2(key_dim), BLOCK_V=block_v, num_warps=DELTA_WARPS)
    return out
