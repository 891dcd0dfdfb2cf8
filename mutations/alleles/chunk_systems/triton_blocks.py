"""The delta rule's per-chunk systems (Qwen3.5's prefill) in one Triton kernel, the inverse taken in blocks of 16 rows.

chunk_systems.triton inverts (I + A) a row at a time: 64 rounds of whole-tile reductions
a program, 4.2 ms a layer for 16,384 tokens on an H200, slower than the two cuBLAS solves
it replaced (docs/log/2026-11-29-hybrid-chunk-systems-in-triton.md). Here a chunk of 64 is
four blocks of 16 rows (flash-linear-attention's solve_tril splits it the same way): each
diagonal block of A is inverted by forward substitution on a 16 x 16 tile, and the blocks
below the diagonal come from products, inverse[i, j] = -inverse[i, i] (sum over j <= m < i
of A[i, m] inverse[m, j]). A, the causal attention, u and w are products of 16-row
blocks. fp32 as the seed; the products in tf32x3 (about fp32's accuracy).
"""
import torch
import triton
import triton.language as tl

REQUIRES = {}
DEVICES = "cuda"

SYSTEM_BLOCK_WARPS = 4  # range: 2..8; warps a chunk's program runs with


@triton.jit
def block_inverse(a, r):
    """(I + a)^-1 of a strictly lower [16, 16] tile a, by forward substitution, kept
    transposed (column i is row i of the inverse; columns past i still zero)."""
    inverse_t = tl.zeros([16, 16], dtype=tl.float32)
    for i in range(16):
        a_row = tl.sum(tl.where(r[:, None] == i, a, 0.0), 0)  # a[i, :]
        column = tl.where(r == i, 1.0, 0.0) - tl.sum(inverse_t * a_row[None, :], 1)
        inverse_t = tl.where(r[None, :] == i, column[:, None], inverse_t)
    return tl.trans(inverse_t)


@triton.jit
def block_rows(ptr, row0, r, cols, ok, WIDTH: tl.constexpr):
    """Rows row0 .. row0 + 15 of a [*, WIDTH] fp32 tensor: [16, len(cols)], zero past WIDTH."""
    return tl.load(ptr + (row0 + r)[:, None] * WIDTH + cols[None, :], mask=ok, other=0.0)


@triton.jit
def decay_ratio(g_i, g_j, r, DIAGONAL: tl.constexpr):
    """exp(G_i - G_j) for rows i of one block and j of another at or before it; on the
    diagonal block, zero above the diagonal (where the difference may overflow)."""
    if DIAGONAL:
        return tl.where(r[:, None] >= r[None, :], tl.exp(g_i[:, None] - g_j[None, :]), 0.0)
    return tl.exp(g_i[:, None] - g_j[None, :])


@triton.jit
def pair_blocks(x_i, y_j, ratio, PRECISION: tl.constexpr):
    """(x_i y_j') exp(G_i - G_j) of two 16-row blocks."""
    return tl.dot(x_i, tl.trans(y_j), input_precision=PRECISION) * ratio


@triton.jit
def inverse_times(i00, i10, i11, i20, i21, i22, i30, i31, i32, i33, x0, x1, x2, x3, out, ok,
                  WIDTH: tl.constexpr, PRECISION: tl.constexpr):
    """Stores inverse @ [x0; x1; x2; x3] (four 16-row blocks of a [64, WIDTH] tensor at `out`),
    the inverse given by its ten blocks on and below the diagonal."""
    tl.store(out, tl.dot(i00, x0, input_precision=PRECISION), mask=ok)
    tl.store(out + 16 * WIDTH, tl.dot(i10, x0, input_precision=PRECISION) + tl.dot(i11, x1, input_precision=PRECISION),
             mask=ok)
    tl.store(out + 32 * WIDTH, tl.dot(i20, x0, input_precision=PRECISION) + tl.dot(i21, x1, input_precision=PRECISION)
             + tl.dot(i22, x2, input_precision=PRECISION), mask=ok)
    tl.store(out + 48 * WIDTH, tl.dot(i30, x0, input_precision=PRECISION) + tl.dot(i31, x1, input_precision=PRECISION)
             + tl.dot(i32, x2, input_precision=PRECISION) + tl.dot(i33, x3, input_precision=PRECISION), mask=ok)


@triton.jit
def chunk_systems_blocks_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, u_ptr, w_ptr, decay_ptr, attention_ptr,
                                KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr,
                                BLOCK_V: tl.constexpr, PRECISION: tl.constexpr):
    """One chunk of 64 tokens of one head, as chunk_systems.triton's kernel, in blocks of 16."""
    chunk = tl.program_id(0)
    r = tl.arange(0, 16)
    dk, dv = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_V)
    k_ok, v_ok = (dk < KEY_DIM)[None, :], (dv < VALUE_DIM)[None, :]
    row = chunk * 64
    q_ptr, k_ptr, w_ptr = q_ptr + row * KEY_DIM, k_ptr + row * KEY_DIM, w_ptr + row * KEY_DIM
    v_ptr, u_ptr = v_ptr + row * VALUE_DIM, u_ptr + row * VALUE_DIM
    g_ptr, beta_ptr, decay_ptr, attention_ptr = g_ptr + row, beta_ptr + row, decay_ptr + row, attention_ptr + row * 64
    # G, each block carried on from the sum of those before it
    g0 = tl.cumsum(tl.load(g_ptr + r), 0)
    g1 = tl.cumsum(tl.load(g_ptr + 16 + r), 0) + tl.sum(tl.load(g_ptr + r), 0)
    g2 = tl.cumsum(tl.load(g_ptr + 32 + r), 0) + tl.sum(tl.load(g_ptr + 16 + r), 0) + tl.sum(tl.load(g_ptr + r), 0)
    g3 = tl.cumsum(tl.load(g_ptr + 48 + r), 0) + tl.sum(tl.load(g_ptr + 32 + r), 0) + \
        tl.sum(tl.load(g_ptr + 16 + r), 0) + tl.sum(tl.load(g_ptr + r), 0)
    tl.store(decay_ptr + r, g0)
    tl.store(decay_ptr + 16 + r, g1)
    tl.store(decay_ptr + 32 + r, g2)
    tl.store(decay_ptr + 48 + r, g3)
    k0, k1 = block_rows(k_ptr, 0, r, dk, k_ok, KEY_DIM), block_rows(k_ptr, 16, r, dk, k_ok, KEY_DIM)
    k2, k3 = block_rows(k_ptr, 32, r, dk, k_ok, KEY_DIM), block_rows(k_ptr, 48, r, dk, k_ok, KEY_DIM)
    # ratios of the ten blocks on and below the diagonal
    e00, e11 = decay_ratio(g0, g0, r, True), decay_ratio(g1, g1, r, True)
    e22, e33 = decay_ratio(g2, g2, r, True), decay_ratio(g3, g3, r, True)
    e10, e20, e30 = decay_ratio(g1, g0, r, False), decay_ratio(g2, g0, r, False), decay_ratio(g3, g0, r, False)
    e21, e31, e32 = decay_ratio(g2, g1, r, False), decay_ratio(g3, g1, r, False), decay_ratio(g3, g2, r, False)
    # the causal attention (q k') exp(G_i - G_j), block row by block row; zero above the diagonal
    zero = tl.zeros([16, 16], dtype=tl.float32)
    cols = (r[:, None] * 64 + r[None, :])
    q = block_rows(q_ptr, 0, r, dk, k_ok, KEY_DIM)
    tl.store(attention_ptr + cols, pair_blocks(q, k0, e00, PRECISION))
    tl.store(attention_ptr + cols + 16, zero)
    tl.store(attention_ptr + cols + 32, zero)
    tl.store(attention_ptr + cols + 48, zero)
    q = block_rows(q_ptr, 16, r, dk, k_ok, KEY_DIM)
    tl.store(attention_ptr + 16 * 64 + cols, pair_blocks(q, k0, e10, PRECISION))
    tl.store(attention_ptr + 16 * 64 + cols + 16, pair_blocks(q, k1, e11, PRECISION))
    tl.store(attention_ptr + 16 * 64 + cols + 32, zero)
    tl.store(attention_ptr + 16 * 64 + cols + 48, zero)
    q = block_rows(q_ptr, 32, r, dk, k_ok, KEY_DIM)
    tl.store(attention_ptr + 32 * 64 + cols, pair_blocks(q, k0, e20, PRECISION))
    tl.store(attention_ptr + 32 * 64 + cols + 16, pair_blocks(q, k1, e21, PRECISION))
    tl.store(attention_ptr + 32 * 64 + cols + 32, pair_blocks(q, k2, e22, PRECISION))
    tl.store(attention_ptr + 32 * 64 + cols + 48, zero)
    q = block_rows(q_ptr, 48, r, dk, k_ok, KEY_DIM)
    tl.store(attention_ptr + 48 * 64 + cols, pair_blocks(q, k0, e30, PRECISION))
    tl.store(attention_ptr + 48 * 64 + cols + 16, pair_blocks(q, k1, e31, PRECISION))
    tl.store(attention_ptr + 48 * 64 + cols + 32, pair_blocks(q, k2, e32, PRECISION))
    tl.store(attention_ptr + 48 * 64 + cols + 48, pair_blocks(q, k3, e33, PRECISION))
    # A = (beta k k') exp(G_i - G_j) below the diagonal, and the blocks of (I + A)^-1
    b0, b1 = tl.load(beta_ptr + r), tl.load(beta_ptr + 16 + r)
    b2, b3 = tl.load(beta_ptr + 32 + r), tl.load(beta_ptr + 48 + r)
    kb0, kb1, kb2, kb3 = k0 * b0[:, None], k1 * b1[:, None], k2 * b2[:, None], k3 * b3[:, None]
    strict = r[:, None] > r[None, :]
    i00 = block_inverse(tl.where(strict, pair_blocks(kb0, k0, e00, PRECISION), 0.0), r)
    i11 = block_inverse(tl.where(strict, pair_blocks(kb1, k1, e11, PRECISION), 0.0), r)
    i22 = block_inverse(tl.where(strict, pair_blocks(kb2, k2, e22, PRECISION), 0.0), r)
    i33 = block_inverse(tl.where(strict, pair_blocks(kb3, k3, e33, PRECISION), 0.0), r)
    a10, a20, a30 = pair_blocks(kb1, k0, e10, PRECISION), pair_blocks(kb2, k0, e20, PRECISION), \
        pair_blocks(kb3, k0, e30, PRECISION)
    a21, a31, a32 = pair_blocks(kb2, k1, e21, PRECISION), pair_blocks(kb3, k1, e31, PRECISION), \
        pair_blocks(kb3, k2, e32, PRECISION)
    i10 = -tl.dot(i11, tl.dot(a10, i00, input_precision=PRECISION), input_precision=PRECISION)
    i21 = -tl.dot(i22, tl.dot(a21, i11, input_precision=PRECISION), input_precision=PRECISION)
    i32 = -tl.dot(i33, tl.dot(a32, i22, input_precision=PRECISION), input_precision=PRECISION)
    i20 = -tl.dot(i22, tl.dot(a20, i00, input_precision=PRECISION) + tl.dot(a21, i10, input_precision=PRECISION),
                  input_precision=PRECISION)
    i31 = -tl.dot(i33, tl.dot(a31, i11, input_precision=PRECISION) + tl.dot(a32, i21, input_precision=PRECISION),
                  input_precision=PRECISION)
    i30 = -tl.dot(i33, tl.dot(a30, i00, input_precision=PRECISION) + tl.dot(a31, i10, input_precision=PRECISION)
                  + tl.dot(a32, i20, input_precision=PRECISION), input_precision=PRECISION)
    # w = inverse (beta k exp(G)), u = inverse (beta v)
    keys = r[:, None] * KEY_DIM + dk[None, :]
    inverse_times(i00, i10, i11, i20, i21, i22, i30, i31, i32, i33, kb0 * tl.exp(g0)[:, None],
                  kb1 * tl.exp(g1)[:, None], kb2 * tl.exp(g2)[:, None], kb3 * tl.exp(g3)[:, None],
                  w_ptr + keys, k_ok, KEY_DIM, PRECISION)
    values = r[:, None] * VALUE_DIM + dv[None, :]
    inverse_times(i00, i10, i11, i20, i21, i22, i30, i31, i32, i33,
                  block_rows(v_ptr, 0, r, dv, v_ok, VALUE_DIM) * b0[:, None],
                  block_rows(v_ptr, 16, r, dv, v_ok, VALUE_DIM) * b1[:, None],
                  block_rows(v_ptr, 32, r, dv, v_ok, VALUE_DIM) * b2[:, None],
                  block_rows(v_ptr, 48, r, dv, v_ok, VALUE_DIM) * b3[:, None], u_ptr + values, v_ok, VALUE_DIM, PRECISION)


def chunk_systems(q, k, v, log_decay, beta):
    """The seed's (u, w, G, attention) for q, k [H, chunks, C, Dk], v [H, chunks, C, Dv],
    log_decay and beta [H, chunks, C], fp32; chunks of 64 tokens (the seed's DELTA_CHUNK)."""
    heads, chunks, size, key_dim = q.shape
    assert size == 64, "the kernel's blocks tile a chunk of 64"
    value_dim = v.shape[-1]
    q, k, v, log_decay, beta = (t.contiguous() for t in (q, k, v, log_decay, beta))
    u, w = torch.empty_like(v), torch.empty_like(k)
    decay = torch.empty_like(log_decay)
    attention = q.new_empty(heads, chunks, size, size)
    if heads * chunks:
        chunk_systems_blocks_kernel[(heads * chunks,)](
            q, k, v, log_decay, beta, u, w, decay, attention, KEY_DIM=key_dim, VALUE_DIM=value_dim,
            BLOCK_K=max(16, triton.next_power_of_2(key_dim)), BLOCK_V=max(16, triton.next_power_of_2(value_dim)),
            PRECISION="tf32x3", num_warps=SYSTEM_BLOCK_WARPS)
    return u, w, decay, attention
