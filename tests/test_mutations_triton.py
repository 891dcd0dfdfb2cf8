"""The cuda-only Triton alleles, run on CPU through Triton's interpreter (each in a fresh
process: TRITON_INTERPRET must be set before triton is imported)."""
import json
import os
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.side_by_side import side_by_side
from tools.probes.alleles import load_allele

FIXTURES = REPO / "tests" / "mutation_fixtures"
INTERPRETED = ["allele.rms_norm.triton", "allele.add_rms_norm.triton", "allele.attend_prefill.triton_varlen",
               "allele.attend_decode.triton_split_kv", "allele.apply_rope.triton", "allele.Engine.cuda_graphs_prefill",
               "allele.KVCache.paged_chunks", "allele.apply_rope.triton_rows", "allele.mlp.swiglu_triton",
               "allele.norm_heads.triton", "allele.attention_inputs.triton"]


def interpreted(*args, timeout):
    return interpreted_side_by_side([args], timeout=timeout)[0]


def interpreted_side_by_side(arg_lists, timeout) -> list:
    """One interpreted process per argument list, all at once (each runs one thread)."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    return side_by_side([[sys.executable, *map(str, args)] for args in arg_lists], timeout, env)


def test_triton_kernels_match_torch_on_cpu():
    """rms_norm, add_rms_norm, the q/k head norms (in place in a fused projection), split-KV
    decode (paged and slab, GQA, head_dim 24 and 256, empty splits), varlen prefill, both
    RoPE kernels, the fused norm, RoPE and K/V write, SwiGLU, the prefetched linear and the
    norms folded into one-row projections against the contract's math, on tiny tensors."""
    done = interpreted(FIXTURES / "triton_kernels.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") >= 85


def test_prefill_graph_engine_matches_the_seed_on_cpu(small_target):
    """cuda_graphs_prefill's static path (buckets, padding rows and prompts, last rows,
    eager fallbacks in groups of prompts, decode after it, all removed and grown again) gives the
    seed's logits, over paged, paged_chunks and a slab that grows (a capture zeroes the static
    buffers)."""
    config_path, weight_dir = small_target
    caches = ("paged", "paged_chunks", "slab")  # one process each, side by side on the machine's cores
    runs = interpreted_side_by_side([(FIXTURES / "prefill_graphs.py", config_path, weight_dir, cache)
                                     for cache in caches], timeout=300)
    for cache, done in zip(caches, runs):
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count(f"ok {cache}: ") == 12, done.stdout


def test_paged_chunks_wants_a_power_of_two_pages_a_chunk():
    """The kernels find a page's chunk by a shift (shared.chunk_row): another CHUNK_PAGES is
    refused when the cache is made, not read from the wrong chunk."""
    module = load_allele("KVCache", "paged_chunks")
    config = {"num_hidden_layers": 1, "max_position_embeddings": 64, "num_key_value_heads": 2, "head_dim": 16}
    module.CHUNK_PAGES = 32
    assert module.KVCache(config, "cpu", torch.float32).chunk_shift == 5
    module.CHUNK_PAGES = 24
    with pytest.raises(ValueError, match="power of two, not 24"):
        module.KVCache(config, "cpu", torch.float32)


@pytest.mark.skipif(os.environ.get("MUTATIONS_SLOW") != "1", reason="about 45 s per allele; MUTATIONS_SLOW=1 runs it")
@pytest.mark.parametrize("operator", INTERPRETED)
def test_triton_child_passes_the_gate_traces_interpreted(operator, small_target, scratch):
    """The whole child engine on the gate's cheap traces plus GQA, head_dim 256 and the
    Hugging Face families' features, with its Triton kernels interpreted on CPU."""
    config_path, weight_dir = small_target
    done = interpreted(FIXTURES / "interpret_gate.py", config_path, weight_dir, scratch, operator, timeout=600)
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["passed"], verdict
