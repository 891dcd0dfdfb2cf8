"""mutations/alleles/shared.py: the bf16-aware attention wrapper the SDPA alleles call."""
import torch
import torch.nn.functional as F

from mutations.alleles import HERE
from tests.conftest import SEED_ENGINE


def shared_namespace() -> dict:
    """shared.py's helpers bound to the seed's masked_attention, as in a program."""
    namespace = {}
    exec(compile(SEED_ENGINE.read_text(), str(SEED_ENGINE), "exec"), namespace)
    path = HERE / "shared.py"  # by its path: triton.jit reads its kernels' source from the file
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def random_qkv(dtype, heads=4, kv_heads=2, t=9, d=16):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, h, t, d, generator=gen).to(dtype) for h in (heads, kv_heads, kv_heads)]


def test_bf16_takes_the_references_rounding():
    ns = shared_namespace()
    q, k, v = random_qkv(torch.bfloat16)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    assert torch.equal(ns["sdpa"](q, k, v, is_causal=True), ns["masked_attention"](q, k, v, causal))


def test_other_dtypes_take_the_fused_kernel():
    ns = shared_namespace()
    q, k, v = random_qkv(torch.float32)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(ns["sdpa"](q, k, v, is_causal=True), fused)


def test_per_request_attention_keeps_prompts_apart():
    ns = shared_namespace()
    q, k, v = (t[0].transpose(0, 1) for t in random_qkv(torch.float32, t=10))  # [10, h, d]
    both = ns["per_request_attention"](q, k, v, [4, 6])
    alone = ns["per_request_attention"](q[4:], k[4:], v[4:], [6])
    torch.testing.assert_close(both[4:], alone)


def test_adjacent_heads_joins_only_views_of_one_projection():
    adjacent_heads = shared_namespace()["adjacent_heads"]  # the seed's
    qkv = torch.randn(3, (4 + 2 + 2) * 8)  # a fused projection: q, k, v heads of 8 in each row
    q, k, v = (t.view(3, -1, 8) for t in qkv.split([32, 16, 16], dim=-1))
    both = adjacent_heads(q, k)
    assert torch.equal(both[:, :4], q) and torch.equal(both[:, 4:], k)
    assert adjacent_heads(q, v) is None  # v does not follow q
    # One token (a batch-1 decode): torch gives each view of the row its own width as the
    # row stride, yet k still follows q; the Qwen3 profile showed RoPE launched twice.
    one = qkv[:1]
    q, k, _ = (t.view(1, -1, 8) for t in one.split([32, 16, 16], dim=-1))
    assert q.stride(0) != k.stride(0)
    both = adjacent_heads(q, k)
    assert both is not None and torch.equal(both[:, :4], q) and torch.equal(both[:, 4:], k)
    assert adjacent_heads(q[:, :2], k) is None  # a gap between them
    # Two tensors end to end in memory, with their own storages (as the CUDA allocator's
    # blocks can be: a search's batch-1 decode crashed on this): not one view.
    memory = bytearray(2 * 4 * 8 * 2)
    q, k = (torch.frombuffer(memory, dtype=torch.float16, count=32, offset=o).view(1, 4, 8) for o in (0, 64))
    assert k.data_ptr() == q.data_ptr() + 64
    assert adjacent_heads(q, k) is None

