"""The Triton alleles' kernels against torch references, on CPU tensors through Triton's
interpreter. Run in a fresh process with TRITON_INTERPRET=1 (the test does); exits non-zero
on the first mismatch. Sizes are tiny: the interpreter runs each program in numpy."""
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 before importing triton"
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NO_CACHE = SimpleNamespace(reference_rounding=False)  # varlen prefill reads only this of its cache
sys.path.insert(0, str(REPO))
from mutations.rewrites.kernels import prefetched_linear as linear  # noqa: E402
from mutations.alleles import load_module as load  # noqa: E402
from tests import triton_interpreter  # noqa: E402

triton_interpreter.install()  # the same interpreter, its per-launch cost cut


def reference_norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def reference_attention(q, k, v, mask):
    """q [heads, Tq, D], k/v [kv_heads, Tk, D], mask [Tq, Tk]: the contract's math."""
    groups = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    scores = (q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1).to(v.dtype) @ v


def check(name, got, want, tol=1e-4, most_differing=1.0):
    """Within `tol` everywhere, and at most a `most_differing` share of elements not equal."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    err = (got.float() - want.float()).abs().max().item() if want.numel() else 0.0
    assert err < tol, f"{name}: max error {err}"
    differing = (got != want).float().mean().item() if want.numel() else 0.0
    assert differing <= most_differing, f"{name}: {differing:.1%} of elements differ"
    print(f"ok {name} (max error {err:.2e}, {differing:.2%} differ)", flush=True)


# Attention that rounds like the reference (each probability divided by its row's whole sum,
# then rounded): in fp16, where the interpreter rounds as a GPU does, 0-0.12% of outputs
# differ from the reference; an online softmax's unnormalised probabilities, ~33%.
ROUNDED = dict(dtype=torch.float16, tol=2e-3, most_differing=0.01)


def check_norms():
    torch.manual_seed(0)
    x, r, w = torch.randn(3, 40), torch.randn(3, 40), torch.rand(40) + 0.5
    check("rms_norm", load("rms_norm", "triton").rms_norm(x, w, 1e-5), reference_norm(x, w, 1e-5))
    normed, total = load("add_rms_norm", "triton").add_rms_norm(x, r, w, 1e-5)
    check("add_rms_norm.sum", total, x + r)
    check("add_rms_norm.norm", normed, reference_norm(x + r, w, 1e-5))


def check_head_norms(name, q, k, tol=1e-4):
    """norm_heads.triton on q [N, heads, D] and k [N, kv_heads, D] against the seed's norm
    of each head (worked out first: the allele writes over q and k)."""
    head_dim, dtype = q.shape[-1], q.dtype
    layer = {"q_norm": (torch.rand(head_dim) + 0.5).to(dtype), "k_norm": (torch.rand(head_dim) + 0.5).to(dtype)}
    want_q, want_k = [reference_norm(x, layer[key], 1e-6) for x, key in ((q, "q_norm"), (k, "k_norm"))]
    got_q, got_k = load("norm_heads", "triton").norm_heads(q, k, layer, 1e-6)
    check(f"{name} q", got_q, want_q, tol)
    check(f"{name} k", got_k, want_k, tol)


def check_norm_heads(head_dim, tokens, dtype=torch.float32, num_heads=4, num_kv_heads=2, tol=1e-4):
    """q and k as views of a fused QKV output [N, (H + 2 KH) * D], as the fused projection
    gives them: normalised in place, v's columns untouched."""
    torch.manual_seed(8)
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim).to(dtype)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    name = f"norm_heads D={head_dim} N={tokens} heads={num_heads}/{num_kv_heads} {dtype}"
    want_v = v.clone()
    check_head_norms(name, q.view(tokens, num_heads, head_dim), k.view(tokens, num_kv_heads, head_dim), tol)
    check(f"{name} v untouched", v, want_v, tol=1e-12)


def check_norm_heads_declines():
    """No norms in the checkpoint: q and k come back as they are. Heads not contiguous
    along D: normalised copies."""
    q, k = torch.randn(3, 4, 8), torch.randn(3, 2, 8)
    got_q, got_k = load("norm_heads", "triton").norm_heads(q, k, {}, 1e-6)
    assert got_q is q and got_k is k
    print("ok norm_heads without norms", flush=True)
    q, k = torch.randn(3, 8, 4).transpose(1, 2), torch.randn(3, 8, 2).transpose(1, 2)  # [N, heads, D], D strided
    check_head_norms("norm_heads D strided", q, k)


def check_decode(page_size, max_positions, head_dim, num_heads=4, num_kv_heads=2, splits=None, lengths=(5, 11),
                 dtype=torch.float32, tol=1e-4, rounding=False, most_differing=1.0, prefetch_batch=1):
    """Requests in a paged (or, with page_size == max_positions, slab) cache; `splits`: each
    request's tokens cut into that many shares of 16-token tiles (some of them empty);
    `rounding`: the cache's reference_rounding; batches up to `prefetch_batch` take the
    first tile apart from the loop (the newest row loaded on its own)."""
    torch.manual_seed(1)
    module = load("attend_decode", "triton_split_kv")
    module.DECODE_PREFETCH_BATCH = prefetch_batch
    if splits:
        module.DECODE_PROGRAMS = module.PREFETCH_PROGRAMS = splits * len(lengths) * num_kv_heads
    num_pages = 1 + sum(-(-n // page_size) for n in lengths) + 2
    k_pages = torch.randn(num_pages, page_size, num_kv_heads, head_dim).to(dtype)
    v_pages = torch.randn(num_pages, page_size, num_kv_heads, head_dim).to(dtype)
    free = list(range(num_pages - 1, 0, -1))  # scattered page order, as a live pool has
    tables = [[free.pop(0) for _ in range(-(-n // page_size))] for n in lengths]
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    cache = SimpleNamespace(k=[k_pages], v=[v_pages], page_size=page_size, max_positions=max_positions,
                            reference_rounding=rounding)
    step = SimpleNamespace(block_table=table, positions=torch.tensor([n - 1 for n in lengths]))
    q = torch.randn(len(lengths), num_heads, head_dim).to(dtype)
    got = module.attend_decode(q, None, None, cache, 0, step)
    for b, n in enumerate(lengths):
        keys = k_pages[table[b]].flatten(0, 1)[:n].transpose(0, 1)  # [kv_heads, n, D]
        values = v_pages[table[b]].flatten(0, 1)[:n].transpose(0, 1)
        want = reference_attention(q[b][:, None], keys, values, torch.ones(1, n, dtype=torch.bool))
        check(f"split_kv page={page_size} D={head_dim} heads={num_heads}/{num_kv_heads} splits={splits} "
              f"{dtype}{' rounding' if rounding else ''}{' prefetch' if len(lengths) <= prefetch_batch else ''} "
              f"request {b} of {n} tokens", got[b], want.flatten(), tol,
              most_differing)


def check_chunked_cache(head_dim=24, num_heads=4, num_kv_heads=2, lengths=(5, 11, 3)):
    """paged_chunks with chunks of 2 pages of 4 rows: prompts spread over several chunks are
    written by its kernel, read back, and attended by the split-KV decode through its table."""
    torch.manual_seed(5)
    module = load("KVCache", "paged_chunks")
    module.PAGE_SIZE, module.CHUNK_PAGES, module.MOVING_POOL_PAGES = 4, 2, 2
    decode = load("attend_decode", "triton_split_kv")
    config = {"num_hidden_layers": 2, "max_position_embeddings": 32, "num_key_value_heads": num_kv_heads,
              "head_dim": head_dim}
    cache = module.KVCache(config, "cpu", torch.float32)
    ids, n = [7, 3, 9], sum(lengths)
    prefill = SimpleNamespace(request_ids=ids, num_new=list(lengths), is_decode=False, positions=None)
    cache.prepare(prefill)
    keys, values = torch.randn(2, n, num_kv_heads, head_dim), torch.randn(2, n, num_kv_heads, head_dim)
    for layer in range(2):
        cache.write(layer, prefill, keys[layer], values[layer])
    assert len(cache.chunks) >= 3, len(cache.chunks)
    step = SimpleNamespace(request_ids=ids, num_new=[1] * 3, is_decode=True,
                           positions=torch.tensor(lengths))  # each request's new token sits at its length
    cache.prepare(step)
    new_k, new_v = torch.randn(3, num_kv_heads, head_dim), torch.randn(3, num_kv_heads, head_dim)
    cache.write(1, step, new_k, new_v)
    q = torch.randn(3, num_heads, head_dim)
    got = decode.attend_decode(q, None, None, cache, 1, step)
    start = 0
    for b, length in enumerate(lengths):
        k_all = torch.cat((keys[1, start:start + length], new_k[b:b + 1]))  # [length + 1, kv_heads, D]
        v_all = torch.cat((values[1, start:start + length], new_v[b:b + 1]))
        read_k, read_v = cache.read(1, ids[b])
        check(f"chunked cache read request {b}", torch.cat((read_k, read_v)), torch.cat((k_all, v_all)), tol=1e-12)
        want = reference_attention(q[b][:, None], k_all.transpose(0, 1), v_all.transpose(0, 1),
                                   torch.ones(1, length + 1, dtype=torch.bool))
        check(f"split_kv over chunks request {b}", got[b], want.flatten())
        start += length
    # bf16: one pool that moves as it grows (the reference's decode indexes k[layer] itself)
    cache = module.KVCache(config, "cpu", torch.bfloat16)
    cache.prepare(prefill)
    cache.write(0, prefill, keys[0].bfloat16(), values[0].bfloat16())
    assert len(cache.chunks) == 1 and cache.generation >= 2, (len(cache.chunks), cache.generation)
    read_k, _ = cache.read(0, ids[1])
    check("bf16 pool after growth", read_k.float(), keys[0, lengths[0]:lengths[0] + lengths[1]].bfloat16().float(), tol=1e-12)
    table_k = cache.k[0][cache.pages_of[ids[1]]].flatten(0, 1)[:lengths[1]]
    check("bf16 pool indexed as k[layer]", table_k.float(), read_k.float(), tol=1e-12)


def layer_of_heads(head_dim, num_heads, num_kv_heads, norms, dtype, max_positions):
    """(cache config, layer with q/k norms or none, q/k/v widths, RoPE inverse frequencies)."""
    config = {"num_hidden_layers": 1, "max_position_embeddings": max_positions, "num_key_value_heads": num_kv_heads,
              "head_dim": head_dim}
    layer = {"q_norm": torch.randn(head_dim).to(dtype), "k_norm": torch.randn(head_dim).to(dtype)} if norms else {}
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    return config, layer, sizes, 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)


def check_attention_inputs(head_dim, norms, dtype=torch.float32, table_dtype=None, num_heads=4, num_kv_heads=2,
                           cache="paged_chunks", rotary=None):
    """attention_inputs.triton against the genes it fuses (norm_heads.triton,
    apply_rope.triton_rows, the cache's write), bit for bit: q and k rewritten in place, and
    the cache's rows, over a prompt of 5 tokens (paged_chunks: two chunks of 2 pages of 4;
    another cache writes its own rows) and one decode. With `rotary` (RoPE on part of each
    head), through the genes the allele then calls, as a program has them."""
    torch.manual_seed(11)
    chunks = load("KVCache", cache)
    chunks.PAGE_SIZE, chunks.CHUNK_PAGES, chunks.POOL_PAGES = 4, 2, 4
    fused = load("attention_inputs", "triton")
    norm, rope = load("norm_heads", "triton"), load("apply_rope", "triton_rows")
    fused.norm_heads = norm.norm_heads
    fused.rotate_heads = lambda q, k, cos, sin: (rope.apply_rope(q, cos, sin), rope.apply_rope(k, cos, sin))
    config, layer, sizes, inv_freq = layer_of_heads(head_dim, num_heads, num_kv_heads, norms, dtype, 32)
    inv_freq = inv_freq[:(rotary or head_dim) // 2]
    caches = [chunks.KVCache(config, "cpu", dtype) for _ in range(2)]
    for new, positions in ((5, torch.arange(5)), (1, torch.tensor([5]))):
        angles = positions.float()[:, None] * inv_freq[None, :]
        cos, sin = angles.cos().to(table_dtype or dtype), angles.sin().to(table_dtype or dtype)
        qkv = torch.randn(new, sum(sizes)).to(dtype)
        outputs = []
        for pool, apart in zip(caches, (True, False)):
            step = SimpleNamespace(request_ids=[3], num_new=[new], is_decode=new == 1, positions=positions)
            pool.prepare(step)
            q, k, v = (t.view(new, -1, head_dim) for t in qkv.clone().split(sizes, dim=-1))
            if apart:
                q, k = norm.norm_heads(q, k, layer, 1e-6)
                q, k = rope.apply_rope(q, cos, sin), rope.apply_rope(k, cos, sin)
                pool.write(0, step, k, v)
            else:
                q, k = fused.attention_inputs(q, k, v, layer, cos, sin, pool, step, 0, 1e-6)
            outputs.append(torch.cat([t.flatten() for t in (q, k, *pool.read(0, 3))]).float())
        label = f"attention_inputs {cache} D={head_dim} rotary={rotary or head_dim} norms={norms} {dtype} tables {table_dtype or dtype} {new} tokens"
        check(label, outputs[1], outputs[0], tol=1e-12)


def check_ready_attention(head_dim, norms, dtype=torch.float32, table_dtype=None, num_heads=4, num_kv_heads=2,
                          lengths=(37,), splits=4, cache="paged_chunks", prefetch_batch=1, rotary=None):
    """attention.split_kv (each split-KV program readies its q heads, the newest token's split
    its k, and stores k and v) against attention_inputs.triton then attend_decode, bit for
    bit: each request's output and its cache rows, after prompts written the same way. With
    `rotary` (RoPE on part of each head), both through the genes."""
    torch.manual_seed(12)
    pools = load("KVCache", cache)
    pools.PAGE_SIZE, pools.CHUNK_PAGES, pools.POOL_PAGES = 4, 2, 4
    decode, inputs = load("attend_decode", "triton_split_kv"), load("attention_inputs", "triton")
    decode.DECODE_PREFETCH_BATCH = prefetch_batch
    decode.DECODE_PROGRAMS = decode.PREFETCH_PROGRAMS = splits * len(lengths) * num_kv_heads
    fused = load("attention", "split_kv")
    fused.split_kv_attention, fused.attention_inputs = decode.split_kv_attention, inputs.attention_inputs
    fused.attend_decode, fused.READY_BATCH = decode.attend_decode, len(lengths)
    fused.DECODE_PREFETCH_BATCH = prefetch_batch
    config, layer, sizes, inv_freq = layer_of_heads(head_dim, num_heads, num_kv_heads, norms, dtype, 64)
    inv_freq = inv_freq[:(rotary or head_dim) // 2]
    caches = [pools.KVCache(config, "cpu", dtype) for _ in range(2)]
    ids = list(range(len(lengths)))
    prompts = SimpleNamespace(request_ids=ids, num_new=[n - 1 for n in lengths], is_decode=False,
                              positions=torch.cat([torch.arange(n - 1) for n in lengths]))
    step = SimpleNamespace(request_ids=ids, num_new=[1] * len(ids), is_decode=True,
                           positions=torch.tensor([n - 1 for n in lengths]))
    outputs = []
    for pool in caches:
        outputs.append([])
        for part in (prompts, step):
            angles = part.positions.float()[:, None] * inv_freq[None, :]
            cos, sin = angles.cos().to(table_dtype or dtype), angles.sin().to(table_dtype or dtype)
            torch.manual_seed(13 + part.is_decode)  # both pools see the same projections
            qkv = torch.randn(part.positions.shape[0], sum(sizes)).to(dtype)
            q, k, v = (t.view(qkv.shape[0], -1, head_dim) for t in qkv.split(sizes, dim=-1))
            pool.prepare(part)
            if not part.is_decode:
                inputs.attention_inputs(q, k, v, layer, cos, sin, pool, part, 0, 1e-6)
            elif pool is caches[0]:
                q, k = inputs.attention_inputs(q, k, v, layer, cos, sin, pool, part, 0, 1e-6)
                outputs[-1].append(decode.attend_decode(q, k, v, pool, 0, part))
            else:
                outputs[-1].append(fused.attention(q, k, v, layer, cos, sin, pool, part, 0, 1e-6))
        outputs[-1] += [torch.cat([t.flatten() for t in pool.read(0, rid)]) for rid in ids]
    label = (f"attention split_kv {cache} D={head_dim} rotary={rotary or head_dim} norms={norms} {dtype} "
             f"tables {table_dtype or dtype} lengths {lengths} splits {splits}")
    check(label, torch.cat([t.flatten() for t in outputs[1]]).float(),
          torch.cat([t.flatten() for t in outputs[0]]).float(), tol=1e-12)


def varlen_allele(blocks=None):
    """attend_prefill.triton_varlen, with (queries, keys) a block when given."""
    module = load("attend_prefill", "triton_varlen")
    if blocks:
        module.PREFILL_BLOCK_M, module.PREFILL_BLOCK_N = blocks
    return module


def check_prefill(head_dim, lengths=(3, 7, 1), num_heads=4, num_kv_heads=2, strided_v=False, rounding=False,
                  dtype=torch.float32, tol=1e-4, most_differing=1.0, blocks=None):
    """`strided_v`: v a view of a fused projection's rows, k its own tensor (rotated apart),
    as a graph engine passes them: each read with its own strides, no copy. `rounding`: the
    cache's reference_rounding. `blocks`: (queries, keys) a block, else the allele's."""
    torch.manual_seed(2)
    module = varlen_allele(blocks)
    n = sum(lengths)
    q, k, v = (torch.randn(n, h, head_dim).to(dtype) for h in (num_heads, num_kv_heads, num_kv_heads))
    if strided_v:
        fused = torch.randn(n, num_heads + 2 * num_kv_heads, head_dim)
        fused[:, num_heads + num_kv_heads:] = v
        v = fused[:, num_heads + num_kv_heads:]
        assert v.stride() != k.stride()
    cache = SimpleNamespace(reference_rounding=rounding)
    got = module.attend_prefill(q, k, v, cache, 0, SimpleNamespace(num_new=list(lengths)))
    start = 0
    for i, t in enumerate(lengths):
        sl = slice(start, start + t)
        want = reference_attention(q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1),
                                   torch.ones(t, t, dtype=torch.bool).tril())  # [heads, t, D]
        check(f"varlen D={head_dim}{' strided v' if strided_v else ''}{' rounding' if rounding else ''} prompt {i}",
              got[sl], want.transpose(0, 1).flatten(1), tol, most_differing)
        start += t


def check_prefill_static(head_dim=24, lengths=(3, 7, 1), prompt_slots=5, rows=16, num_heads=4, num_kv_heads=2,
                         rounding=False, dtype=torch.float32, blocks=None):
    """The captured layout: starts and lengths in padded device buffers (length-0 prompts),
    rows after the prompts that belong to none; those stay zero. `rounding`: the cache's
    reference_rounding (the contract's bf16 prefill is captured too). `blocks` as in
    check_prefill: blocks of fewer queries than `rows` put some past their prompt's end."""
    torch.manual_seed(3)
    module = varlen_allele(blocks)
    cache = SimpleNamespace(reference_rounding=rounding)
    n = sum(lengths)
    q, k, v = (torch.randn(rows, h, head_dim).to(dtype) for h in (num_heads, num_kv_heads, num_kv_heads))
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    padding = [0] * (prompt_slots - len(lengths))
    step = SimpleNamespace(prompt_starts=torch.tensor(starts + padding), prompt_lengths=torch.tensor(list(lengths) + padding))
    got = module.attend_prefill(q, k, v, cache, 0, step)
    eager = module.attend_prefill(q[:n], k[:n], v[:n], cache, 0, SimpleNamespace(num_new=list(lengths)))
    name = f"varlen static D={head_dim}{' rounding' if rounding else ''}"
    check(name, got[:n], eager, tol=1e-6)
    check(f"{name} padding rows", got[n:], torch.zeros_like(got[n:]), tol=1e-12)


def check_rope(head_dim, num_heads=3, tokens=5, dtype=torch.float32, allele="triton", rotary=None):
    """Against the seed's rotation, over the first `rotary` dimensions of each head (all by
    default; Qwen3.5 turns 64 of 256 and keeps the rest), exactly, in bf16 too (the
    interpreter's casts to bf16 round as a GPU's: tests/triton_interpreter.py)."""
    torch.manual_seed(4)
    module = load("apply_rope", allele)
    rotary = rotary or head_dim
    qkv = torch.randn(tokens, (num_heads + 2) * head_dim).to(dtype)
    x = qkv[:, :num_heads * head_dim].view(tokens, num_heads, head_dim)  # strided, as after a fused QKV
    angles = torch.rand(tokens, rotary // 2) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    x0, x1 = x[..., 0:rotary:2], x[..., 1:rotary:2]
    turned = torch.stack((x0 * cos[:, None] - x1 * sin[:, None], x0 * sin[:, None] + x1 * cos[:, None]), -1)
    want = torch.cat((turned.flatten(-2), x[..., rotary:]), dim=-1)
    check(f"rope.{allele} D={head_dim} rotary={rotary} heads={num_heads} {dtype}", module.apply_rope(x, cos, sin),
          want, tol=1e-12)


def check_swiglu(tokens=3, width=40, dtype=torch.float32, tol=1e-4):
    """silu(gate) * up from the stacked projection, against the fused allele's torch ops;
    a block of 16 so that a row takes several programs and the last one is masked. bf16
    takes the kernel too."""
    torch.manual_seed(6)
    module = load("mlp", "swiglu_triton")
    shared = module.swiglu.__globals__  # shared.py's module, whose constants its kernels read
    shared["SWIGLU_BLOCK"] = 16
    layer = {"gate_up": torch.randn(2 * width, 24).to(dtype), "down": torch.randn(24, width).to(dtype)}
    x = torch.randn(tokens, 24).to(dtype)
    gate, up = (x @ layer["gate_up"].T).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ layer["down"].T
    check(f"swiglu {dtype}", module.mlp(x, layer), want, tol=tol * want.abs().max().item())
    # One row folds the product into the down projection: the product's own kernel does not
    # launch; 16 columns a program over a width of 40 padded to 64, the second one's last 8 masked.
    shared["FOLD_ELEMENTS"], kernel = 1024, shared["swiglu_kernel"]
    shared["swiglu_kernel"] = None
    one = x[:1]
    gate, up = (one @ layer["gate_up"].T).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ layer["down"].T
    check(f"swiglu folded into down, one row, {dtype}", module.mlp(one, layer), want, tol=tol * want.abs().max().item())
    shared["swiglu_kernel"], shared["FOLD_WIDTH"] = kernel, 32  # narrower than the width: not folded
    check(f"swiglu one row, not folded, {dtype}", module.mlp(one, layer), want, tol=tol * want.abs().max().item())


def check_glu_matmul(tol=1e-2):
    """mlp.glu_matmul: three fp16 rows' gate/up product with SwiGLU as the kernel's epilogue, 16
    columns a program over a width of 40 (the last program's columns and the rows past 3
    masked) and the inner dimension in 16-wide tiles, the SwiGLU kernel not launched; past
    GLU_ROWS, and in fp32, swiglu_triton's way. (The interpreter's bf16 dot is garbage:
    tests/test_gpu.py checks bf16 compiled.)"""
    torch.manual_seed(7)
    module = load("mlp", "glu_matmul")
    shared = module.swiglu.__globals__
    module.GLU_BLOCK_N, module.GLU_BLOCK_K = 16, 16
    layer = {"gate_up": torch.randn(80, 48).half(), "down": torch.randn(24, 40).half()}
    x = torch.randn(3, 48).half()
    gate, up = (x @ layer["gate_up"].T).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ layer["down"].T
    kernel, shared["swiglu_kernel"] = shared["swiglu_kernel"], None
    check("glu_matmul fp16", module.mlp(x, layer), want, tol=tol * want.abs().max().item())
    rows = module.GLU_ROWS
    shared["swiglu_kernel"], module.GLU_ROWS = kernel, 2
    module.glu_kernel = None
    check("glu_matmul past GLU_ROWS fp16", module.mlp(x, layer), want, tol=tol * want.abs().max().item())
    module.GLU_ROWS = rows
    x, layer = x.float(), {name: w.float() for name, w in layer.items()}
    gate, up = (x @ layer["gate_up"].T).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ layer["down"].T
    check("glu_matmul fp32", module.mlp(x, layer), want, tol=1e-4 * want.abs().max().item())


def check_prefetched_linear():
    """The prefetched_linears rewrite's helper: few fp16 rows (one bf16 row) in the kernel, in
    one share and in three (summed by the second kernel), a strided x; what it leaves to
    torch unchanged."""
    torch.manual_seed(7)
    sum_shares, one_row_share = linear.sum_shares_kernel, linear.PREFETCH_ONE_ROW_SHARE
    # bf16 at one row only: the interpreter's tl.dot misreads bf16 (Triton 3.9: sums of ~1e10).
    # Both dtypes: about a unit in the last place at ~10, the fp32 sums taken in another order.
    for dtype, tol, cases in ((torch.float16, 2e-2, ((1, 1024), (5, 16), (16, 16))),
                              (torch.bfloat16, 8e-2, ((1, 1024), (1, 16)))):
        weight = torch.randn(40, 48).to(dtype)
        for rows, share in cases:
            linear.PREFETCH_SHARE = linear.PREFETCH_ONE_ROW_SHARE = share
            x = torch.randn(rows, 48).to(dtype)
            check(f"prefetched_linear {dtype} rows={rows} share={share}", linear.prefetched_linear(x, weight),
                  (x.float() @ weight.float().T).to(dtype), tol=tol)
            strided = torch.randn(rows, 96).to(dtype)[:, :48]  # rows apart by 96, columns contiguous
            check(f"prefetched_linear {dtype} strided rows={rows}", linear.prefetched_linear(strided, weight),
                  (strided.float() @ weight.float().T).to(dtype), tol=tol)
    # Many rows in wider column blocks (the last one partly past the weight's 40 rows).
    rows_limit, block_n = linear.PREFETCH_ROWS, linear.PREFETCH_ROWS_BLOCK_N
    linear.PREFETCH_ROWS, linear.PREFETCH_ROWS_BLOCK_N, linear.PREFETCH_SHARE = 32, 32, 16
    x, weight = torch.randn(20, 48).half(), torch.randn(40, 48).half()
    check("prefetched_linear float16 rows=20 in 32 columns a program", linear.prefetched_linear(x, weight),
          (x.float() @ weight.float().T).half(), tol=2e-2)
    linear.PREFETCH_ROWS, linear.PREFETCH_ROWS_BLOCK_N = rows_limit, block_n
    # One row in one long share (no second kernel), fewer columns a program: 4, 2 and 1 of
    # them for inner dimensions of 48, 100 and 200 in the registers of 16 x 16 elements.
    linear.PREFETCH_SHARE, linear.PREFETCH_ONE_ROW_SHARE = 16, 16384
    linear.sum_shares_kernel = None  # one share: the second kernel must not launch
    for dtype, tol in ((torch.float16, 2e-2), (torch.bfloat16, 8e-2)):
        for num_in in (48, 100, 200):
            weight = torch.randn(40, num_in).to(dtype)
            x = torch.randn(1, num_in).to(dtype)
            check(f"prefetched_linear {dtype} one row, one share of {num_in}", linear.prefetched_linear(x, weight),
                  (x.float() @ weight.float().T).to(dtype), tol=tol * num_in / 48)
    linear.sum_shares_kernel, linear.PREFETCH_ONE_ROW_SHARE = sum_shares, one_row_share
    weight = torch.randn(40, 48).half()
    # A weight above PREFETCH_WEIGHT: several rows go to torch, one row (PREFETCH_ONE_ROW_WEIGHT
    # apart) still takes the kernel, shown by a kernel that cannot launch.
    linear.PREFETCH_WEIGHT, kernel = 100, linear.prefetched_linear_kernel
    linear.prefetched_linear_kernel = None
    try:
        linear.prefetched_linear(torch.randn(1, 48).half(), weight)
        raise AssertionError("one row above PREFETCH_WEIGHT left to torch")
    except TypeError:  # 'NoneType' object is not subscriptable: the kernel's launch
        print("ok prefetched_linear one row above PREFETCH_WEIGHT takes the kernel", flush=True)
    linear.PREFETCH_ONE_ROW_WEIGHT = 100
    # too many rows; fp32; several rows too large; one row too large
    for x in (torch.randn(17, 48).half(), torch.randn(3, 48), torch.randn(4, 48).half(), torch.randn(1, 48).half()):
        check(f"prefetched_linear left to torch {tuple(x.shape)} {x.dtype}",
              linear.prefetched_linear(x, weight.to(x.dtype)), x @ weight.to(x.dtype).T, tol=1e-12)
    linear.prefetched_linear_kernel = kernel


def check_norm_linear():
    """The fold of a one-row norm into the projection after it (shared.norm_linear, through
    norm_qkv.folded and norm_mlp.folded): bit for bit the kernels apart (add_rms_norm.triton or
    rms_norm.triton, then the one-row prefetched linear, and for the MLP swiglu_kernel), in
    fp16 and bf16, over a row of 48 (padded to 64) and 40 output columns, 4 a program (2 of
    gate and 2 of up for the MLP's); more rows than NORM_FOLD_ROWS take the genes apart, and up
    to it each row folds as one row alone does."""
    torch.manual_seed(8)
    add_norm, norm = load("add_rms_norm", "triton").add_rms_norm, load("rms_norm", "triton").rms_norm
    qkv = load("norm_qkv", "folded")
    mlp = load("norm_mlp", "folded")
    swiglu = load("mlp", "swiglu_triton")
    mlp.mlp = swiglu.mlp  # the mlp it runs beside, as in the recipe
    # the one-row kernel in one share, whatever check_prefetched_linear left
    linear.PREFETCH_ONE_ROW_SHARE, linear.PREFETCH_ONE_ROW_WEIGHT = 16384, 1 << 29
    for module in (qkv, mlp):  # the helpers' own globals: shared.py's and the seed's
        module.norm_linear.__globals__["NORM_FOLD_ELEMENTS"] = 256
        module.pre_norm.__globals__.update(add_rms_norm=add_norm, rms_norm=norm)
        module.add_rms_norm = add_norm
    for dtype in (torch.float16, torch.bfloat16):
        x, residual = torch.randn(1, 48).to(dtype), torch.randn(1, 48).to(dtype)
        norm_weight = (1 + 0.1 * torch.randn(48)).to(dtype)
        layer = {"qkv": torch.randn(40, 48).to(dtype), "qkv_sizes": (24, 8, 8),
                 "gate_up": torch.randn(40, 48).to(dtype), "down": torch.randn(48, 20).to(dtype)}
        h, total = add_norm(x, residual, norm_weight, 1e-5)
        *got, got_total = qkv.norm_qkv(x, residual, norm_weight, layer, 1e-5)
        check(f"norm_qkv folded {dtype}", torch.cat(got, -1), linear.prefetched_linear(h, layer["qkv"]), tol=1e-12)
        check(f"norm_qkv folded {dtype}: the residual stream", got_total, total, tol=1e-12)
        *got, same = qkv.norm_qkv(x, None, norm_weight, layer, 1e-5)  # the first layer: no residual
        check(f"norm_qkv folded {dtype}, first layer", torch.cat(got, -1),
              linear.prefetched_linear(norm(x, norm_weight, 1e-5), layer["qkv"]), tol=1e-12)
        assert same is x, "the first layer's residual stream is x itself"
        # norm_mlp: silu(gate) * up in the projection's programs, as swiglu_kernel makes it
        # from the prefetched projection's gate and up; the down projection after it.
        gate_up = linear.prefetched_linear(h, layer["gate_up"])
        width = gate_up.shape[1] // 2
        product = torch.empty(1, width, dtype=dtype)
        swiglu.swiglu_kernel[(1, 1)](gate_up, product, gate_up.stride(0), product.stride(0), width, BLOCK=32)
        got, _ = mlp.norm_linear(x, residual, norm_weight, layer["gate_up"], 1e-5, glu=True)
        check(f"norm_linear glu {dtype}: silu(gate) * up", got, product, tol=1e-12)
        got, got_total = mlp.norm_mlp(x, residual, norm_weight, layer, 1e-5)
        check(f"norm_mlp folded {dtype}", got, product @ layer["down"].T, tol=1e-12)
        check(f"norm_mlp folded {dtype}: the residual stream", got_total, total, tol=1e-12)
        # A sparse layer: the norm folds into the router's projection, whose program 0 writes
        # the normed row too; the experts take both.
        sparse = {"router": torch.randn(6, 48).to(dtype), "top_k": 2, "renormalise": True,
                  "experts_gate": torch.randn(6, 20, 48).to(dtype), "experts_up": torch.randn(6, 20, 48).to(dtype),
                  "experts_down": torch.randn(6, 48, 20).to(dtype), "shared_gate": torch.randn(20, 48).to(dtype),
                  "shared_up": torch.randn(20, 48).to(dtype), "shared_down": torch.randn(48, 20).to(dtype),
                  "shared_expert_gate": torch.randn(1, 48).to(dtype)}  # Qwen3.5's: a shared expert too
        logits, got_total, got_h = mlp.norm_linear(x, residual, norm_weight, sparse["router"], 1e-5, normed=True)
        check(f"norm_linear normed {dtype}: the logits", logits, linear.prefetched_linear(h, sparse["router"]), tol=1e-12)
        check(f"norm_linear normed {dtype}: the normed row", got_h, h, tol=1e-12)
        check(f"norm_linear normed {dtype}: the residual stream", got_total, total, tol=1e-12)
        got, got_total = mlp.norm_mlp(x, residual, norm_weight, sparse, 1e-5)
        check(f"norm_mlp folded, a sparse layer {dtype}", got, mlp.moe(h, sparse, logits), tol=1e-12)
        check(f"norm_mlp folded, a sparse layer {dtype}: the residual stream", got_total, total, tol=1e-12)
    # Several rows, and a row wider than NORM_FOLD_WIDTH, take the genes apart: the fold's
    # kernel cannot launch.
    shared = qkv.norm_linear.__globals__
    qkv.qkv_proj, kernel = load("qkv_proj", "fused").qkv_proj, qkv.norm_linear_kernel
    shared["norm_linear_kernel"] = None
    x, residual = torch.randn(3, 48).to(dtype), torch.randn(3, 48).to(dtype)
    *got, _ = qkv.norm_qkv(x, residual, norm_weight, layer, 1e-5)
    check("norm_qkv folded, three rows", torch.cat(got, -1),
          add_norm(x, residual, norm_weight, 1e-5)[0] @ layer["qkv"].T, tol=1e-12)
    width, shared["NORM_FOLD_WIDTH"] = shared["NORM_FOLD_WIDTH"], 32
    *got, _ = qkv.norm_qkv(x[:1], residual[:1], norm_weight, layer, 1e-5)
    check("norm_qkv folded, a row over NORM_FOLD_WIDTH", torch.cat(got, -1),
          add_norm(x[:1], residual[:1], norm_weight, 1e-5)[0] @ layer["qkv"].T, tol=1e-12)
    shared["norm_linear_kernel"], shared["NORM_FOLD_WIDTH"] = kernel, width
    # Up to NORM_FOLD_ROWS rows fold too, each row bit for bit as the one-row fold makes it.
    for module in (qkv, mlp):
        module.norm_linear.__globals__["NORM_FOLD_ROWS"] = 4
    for dtype in (torch.float16, torch.bfloat16):
        x, residual = torch.randn(3, 48).to(dtype), torch.randn(3, 48).to(dtype)
        norm_weight = (1 + 0.1 * torch.randn(48)).to(dtype)
        layer = {"qkv": torch.randn(40, 48).to(dtype), "qkv_sizes": (24, 8, 8),
                 "gate_up": torch.randn(40, 48).to(dtype), "down": torch.randn(48, 20).to(dtype)}
        rows = [qkv.norm_qkv(x[i:i + 1], residual[i:i + 1], norm_weight, layer, 1e-5) for i in range(3)]
        *got, got_total = qkv.norm_qkv(x, residual, norm_weight, layer, 1e-5)
        check(f"norm_qkv folded, three rows {dtype}", torch.cat(got, -1),
              torch.cat([torch.cat(row[:3], -1) for row in rows]), tol=1e-12)
        check(f"norm_qkv folded, three rows {dtype}: the residual stream", got_total,
              torch.cat([row[3] for row in rows]), tol=1e-12)
        rows = [mlp.norm_linear(x[i:i + 1], residual[i:i + 1], norm_weight, layer["gate_up"], 1e-5, glu=True)[0]
                for i in range(3)]
        got, _ = mlp.norm_linear(x, residual, norm_weight, layer["gate_up"], 1e-5, glu=True)
        check(f"norm_linear glu, three rows {dtype}", got, torch.cat(rows), tol=1e-12)
    for module in (qkv, mlp):
        module.norm_linear.__globals__["NORM_FOLD_ROWS"] = 1


if __name__ == "__main__":
    check_norms()
    for head_dim in (64, 128):
        for tokens in (0, 1, 5):
            check_norm_heads(head_dim, tokens)
            # one fp16 step of 4: the fp32 sum's order differs from torch's mean
            check_norm_heads(head_dim, tokens, dtype=torch.float16, tol=4e-3)
    check_norm_heads_declines()
    check_decode(page_size=4, max_positions=16, head_dim=24)  # paged, head_dim not a power of 2
    check_decode(page_size=16, max_positions=16, head_dim=24)  # slab: one page per request
    check_decode(page_size=4, max_positions=64, head_dim=24, splits=4, lengths=(5, 40, 17))  # 1, 3, 2 live splits
    check_decode(page_size=4, max_positions=64, head_dim=24, splits=1, lengths=(5, 40, 17))
    for lengths in ((40,), (17,), (1,)):  # batch 1: the first tile before the wait, the newest row apart
        check_decode(page_size=4, max_positions=64, head_dim=24, splits=4, lengths=lengths)
        check_decode(page_size=4, max_positions=64, head_dim=24, splits=1, lengths=lengths)  # the newest past it
    check_decode(page_size=4, max_positions=64, head_dim=24, splits=4, lengths=(5, 40, 17), prefetch_batch=3)
    check_decode(page_size=4, max_positions=64, head_dim=32, splits=4, lengths=(40,), rounding=True, **ROUNDED)
    check_decode(page_size=8, max_positions=16, head_dim=256, num_heads=2, num_kv_heads=1)
    check_decode(page_size=4, max_positions=64, head_dim=64, num_heads=16, num_kv_heads=2, splits=2,
                 lengths=(5, 40), dtype=torch.float16, tol=2e-3)  # groups of 8 query heads a K/V head, fp16 tensor-core dots
    check_decode(page_size=4, max_positions=64, head_dim=32, splits=4, lengths=(5, 40, 17), rounding=True, **ROUNDED)
    check_decode(page_size=4, max_positions=64, head_dim=32, lengths=(5, 40, 17), rounding=True, **ROUNDED)
    check_decode(page_size=4, max_positions=64, head_dim=32, splits=1, lengths=(5, 40, 17), rounding=True,
                 **ROUNDED)  # one split: phase one writes the answer, no combine
    check_chunked_cache()
    check_attention_inputs(head_dim=24, norms=True)
    check_attention_inputs(head_dim=32, norms=False, dtype=torch.float16)
    check_attention_inputs(head_dim=64, norms=True, dtype=torch.bfloat16, table_dtype=torch.float32, num_heads=8)
    check_attention_inputs(head_dim=32, norms=True, dtype=torch.bfloat16)  # the contract's bf16 (bf16 tables)
    check_attention_inputs(head_dim=24, norms=True, cache="paged")
    check_ready_attention(head_dim=24, norms=True)  # the newest token in the prefetched tile
    check_ready_attention(head_dim=24, norms=False, lengths=(40,), splits=1)  # ... in the loop's last tile
    check_ready_attention(head_dim=64, norms=True, dtype=torch.bfloat16, table_dtype=torch.float32, num_heads=8,
                          lengths=(5, 40, 17), prefetch_batch=3)  # a Hugging Face checkpoint's dtypes
    check_ready_attention(head_dim=32, norms=False, dtype=torch.float16, lengths=(5, 40), cache="paged")
    check_ready_attention(head_dim=32, norms=True, dtype=torch.bfloat16, lengths=(40,))  # bf16 tables
    check_prefill(head_dim=24)
    check_prefill(head_dim=32, lengths=(37, 5, 70), rounding=True, **ROUNDED)
    check_prefill(head_dim=256, lengths=(5, 2), num_heads=2, num_kv_heads=1)
    check_prefill(head_dim=24, strided_v=True)
    check_prefill(head_dim=32, lengths=(40, 5), blocks=(16, 16))  # unmasked key blocks before the diagonal
    check_prefill_static()
    check_prefill_static(lengths=(20, 7, 1), rows=32, blocks=(16, 16))
    check_prefill_static(rounding=True, dtype=torch.float16)
    check_rope(head_dim=24)
    check_rope(head_dim=256, num_heads=1)
    check_rope(head_dim=24, allele="triton_rows")
    check_rope(head_dim=256, num_heads=1, allele="triton_rows")
    check_rope(head_dim=24, num_heads=5, dtype=torch.float16, allele="triton_rows")
    check_rope(head_dim=24, num_heads=5, dtype=torch.bfloat16)
    check_rope(head_dim=24, num_heads=5, dtype=torch.bfloat16, allele="triton_rows")
    check_rope(head_dim=32, rotary=8)  # Qwen3.5's partial RoPE: the rest of each head kept
    check_rope(head_dim=32, rotary=8, allele="triton_rows")
    check_attention_inputs(head_dim=32, norms=True, rotary=8)
    check_ready_attention(head_dim=32, norms=True, rotary=8)
    check_swiglu()
    check_swiglu(dtype=torch.bfloat16, tol=4e-3)  # a unit in the last place at the largest output
    check_glu_matmul()
    check_prefetched_linear()
    check_norm_linear()
    sys.exit(0)
