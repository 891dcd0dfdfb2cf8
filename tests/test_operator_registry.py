"""How operators are registered: the order the search indexes them in, and what each
declares of itself (its rng draws, the swap it needs on the seed)."""
import random

import pytest

import mutations
from mutations.base import Operator
from tests.conftest import SEED_ENGINE

SEED = SEED_ENGINE.read_text()

# Every operator as of 2026-11-25, in order. The search draws operators by their index in
# all_operators(), so these keep their relative order; a new one may go anywhere.
ORDER_2026_11_25 = [
    "allele.load_weights.seed", "allele.load_weights.fused_both", "allele.load_weights.fused_gate_up",
    "allele.load_weights.fused_qkv", "allele.rms_norm.seed", "allele.rms_norm.triton", "allele.add_rms_norm.seed",
    "allele.add_rms_norm.triton", "allele.rope_tables.seed", "allele.rope_tables.cached", "allele.apply_rope.seed",
    "allele.apply_rope.triton", "allele.apply_rope.triton_rows", "allele.qkv_proj.seed", "allele.qkv_proj.fused",
    "allele.mlp.seed", "allele.mlp.fused", "allele.mlp.swiglu_triton", "allele.KVCache.seed", "allele.KVCache.paged",
    "allele.KVCache.paged_chunks", "allele.KVCache.slab", "allele.attend_prefill.seed",
    "allele.attend_prefill.padded_sdpa", "allele.attend_prefill.sdpa_per_request",
    "allele.attend_prefill.triton_varlen", "allele.attend_decode.seed", "allele.attend_decode.gather_sdpa",
    "allele.attend_decode.padded_sdpa", "allele.attend_decode.table_sdpa", "allele.attend_decode.triton_split_kv",
    "allele.Engine.seed", "allele.Engine.cuda_graphs", "allele.Engine.cuda_graphs_prefill",
    "fuse_linears", "torch_compile", "tune_constant", "hoist_tables", "last_token_logits", "programmatic_launch",
    "prefetched_linears",
]


def test_operators_keep_their_order():
    names = [op.name for op in mutations.all_operators()]
    assert len(set(names)) == len(names), "two operators share a name"
    assert [n for n in names if n in ORDER_2026_11_25] == ORDER_2026_11_25


@pytest.mark.parametrize("op", mutations.all_operators(), ids=lambda op: op.name)
def test_an_operator_that_draws_declares_it(op):
    """An undeclared draw would be replayed with Random(0)'s choice, not the recorded one."""
    source = mutations.with_work_for(op.name, SEED)
    assert op.applies(source) is None, f"{op.name} has nothing to do after its needs_swap: {op.applies(source)}"
    rng = random.Random(0)
    before = rng.getstate()
    op.apply(source, rng)
    drew = rng.getstate() != before
    assert drew == op.draws, f"{op.name} {'draws' if drew else 'draws nothing'} but declares draws = {op.draws}"
    if op.draws:
        assert type(op).rewrite_as is not Operator.rewrite_as, f"{op.name} draws but replays by drawing from Random(0)"
