"""tools.probes.step_without: the recipe's program with one part of every layer left out."""
import ast

import pytest

from tests.conftest import SEED_ENGINE
from tools.probes import step_without


@pytest.mark.parametrize("part, gone, kept", [
    ("attention", "attention(q, k, v, layer, cos, sin, self.cache, step, i, self.eps)",
     'prefetched_linear(q.reshape(n, -1), layer["o"])'),
    ("combine", "split_kv_combine_kernel[(batch, num_heads)](", "def split_kv_combine_kernel("),
    ("mlp", 'norm_mlp(x, attn_out, layer["post_norm"], layer, self.eps)', "out = attn_out"),
])
def test_each_part_leaves_the_recipe_once_and_nothing_else(fastest_source, part, gone, kept):
    variant = step_without.without(fastest_source, part)
    ast.parse(variant)
    assert gone in fastest_source and gone not in variant and kept in variant
    changed = [line for line in variant.splitlines() if line not in fastest_source.splitlines()]
    assert len(changed) <= 1, changed  # a line rewritten in place, or lines only removed


def test_a_part_the_engine_lacks_is_an_error_naming_it():
    with pytest.raises(ValueError, match="combine: its code is in the engine 0 times"):
        step_without.without(SEED_ENGINE.read_text(), "combine")
