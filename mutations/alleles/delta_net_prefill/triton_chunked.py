"""A Gated DeltaNet's prefill (Qwen3.5): all prompts' chunks solved at once, the state carried through them in Triton.

The seed solves each prompt's chunks apart and carries the state through them in a Python
loop: for a 1,024-token prompt, 16 rounds of five launches a layer, and again for each
prompt. Here every prompt is padded to whole chunks (padding writes nothing: beta 0,
decay 1), all chunks of all prompts are solved in one batched chunk_systems, and
chunk_states_kernel, a program per prompt, value head and block of value columns, keeps
its [key dim, BLOCK_V] block of the state in registers through the prompt's chunks:
new = u - w S, out = (q exp(G)) S + attention new, S = exp(G_end) S + (k exp(G_end - G))' new;
then stores the state for decode (flash-linear-attention's chunk_gated_delta_rule_fwd_h
splits the same loop the same way). The inputs go into the padded layout in one kernel too
(padded_inputs_kernel: each token's q and k normalised, q scaled, v, decay and beta, written
at their padded rows): in torch that took ten passes over tensors of up to 512 MB for 16
prompts of 1,024 tokens, a share of the ~25 ms of elementwise passes, copies and index_copy
that 4 layers' prefill spent on an H200 (docs/log/2026-11-29-hybrid-chunk-systems-in-triton.md).
fp32 throughout, as the seed; in a bf16 or fp16 engine the kernel's products take tf32 inputs
(tensor cores; 10 bits of mantissa, more than the engine's own 7 or 10): with fp32 inputs the dots ran on the FMA units, 45 ms a layer for
64 prompts of 256 tokens on an H200 (docs/log/2026-11-29-hybrid-decode-graphs-served-hackathon-sweep.md).
"""
import math

import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

CHUNK_BLOCK_V = 32  # range: 16..128; value columns a program carries (a [key dim, BLOCK_V] fp32 state block)
CHUNK_WARPS = 4  # range: 2..8
CHUNK_STAGES = 1  # range: 1..3; software pipelining of the chunk loop's loads (2 tiles of 64 x 128 fp32 a stage)


@triton.jit
def chunk_states_kernel(q_ptr, k_ptr, u_ptr, w_ptr, g_ptr, a_ptr, out_ptr, state_ptr, first_ptr, count_ptr,
                        heads, chunks, KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, PRECISION: tl.constexpr):
    """For prompt r's chunks first[r] .. first[r] + count[r] of head h: its output rows and, at
    the end, its state [KEY_DIM, BLOCK_V] block. q, k, w [H, chunks, CHUNK, KEY_DIM], u and
    out [H, chunks, CHUNK, VALUE_DIM], g [H, chunks, CHUNK], a [H, chunks, CHUNK, CHUNK].
    BLOCK_K and BLOCK_V are at least 16 (tl.dot's least), masked past small heads; the dots
    take PRECISION ("ieee" or "tf32") inputs."""
    r, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = tl.arange(0, CHUNK)
    dk = tl.arange(0, BLOCK_K)
    dv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok, v_ok = (dk < KEY_DIM)[None, :], (dv < VALUE_DIM)[None, :]
    state = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    first = tl.load(first_ptr + r)
    for c in range(first, first + tl.load(count_ptr + r)):
        chunk = h * chunks + c
        keys = chunk * CHUNK * KEY_DIM + t[:, None] * KEY_DIM + dk[None, :]
        values = chunk * CHUNK * VALUE_DIM + t[:, None] * VALUE_DIM + dv[None, :]
        g = tl.load(g_ptr + chunk * CHUNK + t)
        g_end = tl.load(g_ptr + chunk * CHUNK + CHUNK - 1)
        new = tl.load(u_ptr + values, mask=v_ok, other=0.0) - \
            tl.dot(tl.load(w_ptr + keys, mask=k_ok, other=0.0), state, input_precision=PRECISION)
        q = tl.load(q_ptr + keys, mask=k_ok, other=0.0) * tl.exp(g)[:, None]
        a = tl.load(a_ptr + chunk * CHUNK * CHUNK + t[:, None] * CHUNK + t[None, :])
        out = tl.dot(q, state, input_precision=PRECISION) + tl.dot(a, new, input_precision=PRECISION)
        tl.store(out_ptr + values, out, mask=v_ok)
        k = tl.load(k_ptr + keys, mask=k_ok, other=0.0) * tl.exp(g_end - g)[:, None]
        state = state * tl.exp(g_end) + tl.dot(tl.trans(k), new, input_precision=PRECISION)
    tl.store(state_ptr + ((r * heads + h) * KEY_DIM + dk[:, None]) * VALUE_DIM + dv[None, :], state,
             mask=(dk < KEY_DIM)[:, None] & v_ok)


@triton.jit
def padded_inputs_kernel(x_ptr, decay_in_ptr, beta_in_ptr, rows_ptr, q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr,
                         x_stride, padded_rows, heads, group, scale, KEY_DIM: tl.constexpr,
                         VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """Token n's inputs for value head h at row rows[n] of the padded layout: q and k
    [H, padded_rows, KEY_DIM] (from key head h // group, unit length, q over `scale`), v
    [H, padded_rows, VALUE_DIM], decay and beta [H, padded_rows]; x [N, conv_dim] is the
    conv's output (q, k, v side by side), decay_in and beta_in [N, H]."""
    n, h = tl.program_id(0), tl.program_id(1)
    dk, dv = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_V)
    k_ok, v_ok = dk < KEY_DIM, dv < VALUE_DIM
    key_width = (heads // group) * KEY_DIM
    x = x_ptr + n.to(tl.int64) * x_stride
    q = tl.load(x + (h // group) * KEY_DIM + dk, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(x + key_width + (h // group) * KEY_DIM + dk, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(x + 2 * key_width + h * VALUE_DIM + dv, mask=v_ok, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) / scale
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    at = h.to(tl.int64) * padded_rows + tl.load(rows_ptr + n)
    tl.store(q_ptr + at * KEY_DIM + dk, q, mask=k_ok)
    tl.store(k_ptr + at * KEY_DIM + dk, k, mask=k_ok)
    tl.store(v_ptr + at * VALUE_DIM + dv, v, mask=v_ok)
    tl.store(decay_ptr + at, tl.load(decay_in_ptr + n * heads + h).to(decay_ptr.dtype.element_ty))
    tl.store(beta_ptr + at, tl.load(beta_in_ptr + n * heads + h).to(beta_ptr.dtype.element_ty))


def padded_inputs(convolved, log_decay, beta, lin, rows, chunks):
    """q, k, v, log_decay and beta [H, chunks, DELTA_CHUNK, ...] (q, k, v in fp32): each
    prompt's tokens at its chunks' rows, zeros past its end (beta 0, decay 1: no write)."""
    heads, key_dim, value_dim = lin["value_heads"], lin["key_dim"], lin["value_dim"]
    padded_rows, device = chunks * DELTA_CHUNK, convolved.device
    q, k = (torch.zeros(heads, padded_rows, key_dim, device=device) for _ in range(2))
    v = torch.zeros(heads, padded_rows, value_dim, device=device)
    decay, gate = log_decay.new_zeros(heads, padded_rows), beta.new_zeros(heads, padded_rows)
    convolved = convolved if convolved.stride(-1) == 1 else convolved.contiguous()
    padded_inputs_kernel[(len(convolved), heads)](
        convolved, log_decay.contiguous(), beta.contiguous(), rows, q, k, v, decay, gate, convolved.stride(0),
        padded_rows, heads, heads // lin["key_heads"], math.sqrt(key_dim), KEY_DIM=key_dim, VALUE_DIM=value_dim,
        BLOCK_K=triton.next_power_of_2(key_dim), BLOCK_V=triton.next_power_of_2(value_dim))
    return (t.view(heads, chunks, DELTA_CHUNK, *t.shape[2:]) for t in (q, k, v, decay, gate))


def delta_net_prefill(mixed, log_decay, beta, lin, states, step, index):
    """The seed's prefill: [N, value heads, value dim] (fp32) from mixed [N, conv_dim],
    log_decay and beta [N, value heads]; each prompt's states written."""
    convolved, conv_states = prompt_convs(mixed, lin, step)
    heads, key_dim, value_dim = lin["value_heads"], lin["key_dim"], lin["value_dim"]
    lengths = torch.tensor(step.num_new)
    count = (lengths + DELTA_CHUNK - 1) // DELTA_CHUNK  # chunks per prompt
    first = count.cumsum(0) - count
    chunks = int(count.sum())
    rows = torch.cat([torch.arange(n) + DELTA_CHUNK * f for n, f in zip(step.num_new, first.tolist())]).to(mixed.device)

    q, k, v, log_decay, beta = padded_inputs(convolved, log_decay, beta, lin, rows, chunks)
    u, w, decay, attention = chunk_systems(q, k, v, log_decay, beta)
    out = torch.empty(u.shape, device=u.device)  # contiguous (the solve's u may not be)
    matrices = torch.empty(len(step.num_new), heads, key_dim, value_dim, device=mixed.device)
    block_v = min(CHUNK_BLOCK_V, max(16, triton.next_power_of_2(value_dim)))
    chunk_states_kernel[(len(step.num_new), heads, triton.cdiv(value_dim, block_v))](
        q, k, u.contiguous(), w.contiguous(), decay.contiguous(), attention.contiguous(), out, matrices,
        first.to(mixed.device), count.to(mixed.device), heads, chunks, KEY_DIM=key_dim, VALUE_DIM=value_dim,
        CHUNK=DELTA_CHUNK, BLOCK_K=max(16, triton.next_power_of_2(key_dim)), BLOCK_V=block_v, num_warps=CHUNK_WARPS,
        num_stages=CHUNK_STAGES, PRECISION="ieee" if mixed.dtype == torch.float32 else "tf32")
    states.write(index, step, conv_states, matrices)
    return out.reshape(heads, chunks * DELTA_CHUNK, value_dim).transpose(0, 1)[rows]
