"""The cuda-only Triton alleles, run on CPU through Triton's interpreter (each in a fresh
process: TRITON_INTERPRET must be set before triton is imported), and compiled for an H100
(sm_90) without one where what the compiler makes of them matters: how wide their loads
are, whether a division routine is called."""
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tests.conftest import REPO
from tests.side_by_side import side_by_side
from mutations.alleles import load_module as load_allele

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
    norms folded into projections of one or a few rows against the contract's math, on tiny tensors."""
    done = interpreted(FIXTURES / "triton_kernels.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") >= 85


def test_moe_kernels_match_the_seed_on_cpu():
    """route.triton_topk (fp32, fp16, renormalised or not, equal logits), moe.triton_grouped
    (1 to 600 tokens, each bucket of knobs, by rank and sorted, one expert's pairs over two
    tiles, 128 experts top 8, fp16; a batch-1 step a pair at a time, in bf16 too, and by tiles) and
    plus_shared_expert.triton (1 to 8 rows in fp16; past its rows and in fp32, the seed's ops)
    against the seed's route, sorted experts and shared expert."""
    done = interpreted(FIXTURES / "moe_kernels.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") == 30, done.stdout


def test_delta_net_kernels_match_the_seed_on_cpu():
    """delta_net_prefill.triton_chunked (prompts of 70, 4 and 130 tokens at once, exactly a
    chunk, a lone token; heads of 8 under tl.dot's 16) and delta_net_decode.triton_fused
    (three steps, states in scattered slots) against the seed's genes: outputs, the
    delta rule's states, the conv's; delta_gates.triton (fp32 and fp16, no rows too; a
    program's heads and a step's dims at two settings) and gated_rms_norm.triton (the same
    dtypes); chunk_systems.triton (heads of 8 to 32, a padded chunk; keys alike, against the
    seed in fp64; A's rows from the registers and from a scratch) and prompt_convs.triton
    (fp32 and bf16, prompts shorter than the conv)."""
    done = interpreted(FIXTURES / "delta_net_kernels.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") == 182, done.stdout


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


def sm90_ptx(kernel, constants: dict, num_stages: int, divisible=(), **types) -> str:
    """The PTX Triton writes for `kernel` on an H100 (sm_90), compiled here without a GPU:
    pointers fp16 and strides, counts and the chunk shift i32 where `types` names no other,
    pointers, strides and the `divisible` integers marked 16-divisible, as the launcher
    specialises real ones."""
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").is_file():
        pytest.skip("this triton wheel carries no ptxas: no compiling for sm_90 here")
    names = kernel.arg_names
    types = {**{name: "*fp16" for name in names if name.endswith("_ptr")},
             **{name: "i32" for name in names if name.startswith(("stride", "num_")) or name == "chunk_shift"},
             **types}
    signature = {name: types.get(name, "constexpr") for name in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if types.get(name, "").startswith("*") or name.startswith("stride") or name in divisible}
    source = ASTSource(fn=kernel, signature=signature, attrs=attrs,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    options = {"num_warps": 4, "num_stages": num_stages, "enable_fp_fusion": True}  # a launch's default, named
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def divisions(ptx: str) -> list:
    """The 64-bit integer divisions in `ptx`: each a subroutine call in the SASS."""
    return re.findall(r"(?:div|rem)\.[su]64", ptx)


@pytest.mark.parametrize("prefetch,ready", [(False, False), (True, False), (True, True), (False, True)])
def test_the_split_kv_decode_reads_its_rows_16_bytes_at_a_time_on_sm_90(prefetch, ready):
    """A row's address adds a chunk offset loaded from memory; undeclared, its alignment is
    unknown and every K/V element was loaded alone (ld.global.b16), and the chunk was a 64-bit
    division, a subroutine call: Qwen3-0.6B's 64 x 256 step ran 3.52 ms against 2.21 (H100).
    READY (attention.split_kv) compiles too: the interpreter does not check a loop's types."""
    module = load_allele("attend_decode", "triton_split_kv")
    ptx = sm90_ptx(module.split_kv_partial_kernel,
                   dict(PAGE_SIZE=16, GROUPS=2, SPLITS=2, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_N=16,
                        PRECISION="tf32", PHASE=0, PREFETCH=prefetch, READY=ready, NORM=ready, PDL=prefetch),
                   num_stages=2, table_ptr="*i32", offsets_ptr="*i64", positions_ptr="*i64", part_acc_ptr="*fp32",
                   part_max_ptr="*fp32", part_sum_ptr="*fp32", cos_ptr="*fp32", sin_ptr="*fp32", sm_scale="fp32",
                   eps="fp32")
    loads = re.findall(r"(?:ld\.global|cp\.async\.c[ag]\.shared\.global)[\w.]*", ptx)
    # READY's four one-row loads (the newest k and v, the two norms' weights: 256 bytes each,
    # an element a thread) go 2 bytes at a time; nothing else may.
    assert loads.count("ld.global.b16") == (4 if ready else 0) and "ld.global.u16" not in loads, loads
    assert set(loads) & {"ld.global.v4.b32", "cp.async.cg.shared.global"}, loads
    assert not divisions(ptx)


def test_the_split_kv_decode_reads_before_its_wait_only_what_the_step_does_not_write():
    """Under programmatic launch a batch-1 split loads its first tile before its wait, while
    the kernels before may still run; whatever it reads then must have been written before
    the step (positions, block table, cache rows of earlier steps, norms' weights). The
    token's RoPE angles are not: the engine's first kernel writes them, and read before the
    wait they raced with it (a Llama-3.2-1B gate failed at 2.88x the tolerance on an H100)."""
    source = load_allele("attend_decode", "triton_split_kv").split_kv_partial_kernel.src
    body = source.split('"""')[2]  # after the docstring
    before = body[:body.rindex("gdc_wait()")]
    written_in_the_step = ["q_ptr", "new_k_ptr", "new_v_ptr", "cos_ptr", "sin_ptr", "part_acc_ptr", "part_max_ptr",
                           "part_sum_ptr"]
    assert [name for name in written_in_the_step if re.search(rf"\b{name}\b", before)] == []
    assert re.search(r"\bk_ptr\b", before) and re.search(r"\btable_ptr\b", before)  # the tile is read there


@pytest.mark.parametrize("glu,rows", [(False, 1), (True, 1), (True, 4)])
def test_the_norm_fold_reads_its_weights_16_bytes_at_a_time_on_sm_90(glu, rows):
    """shared.norm_linear_kernel (norm_qkv.folded, norm_mlp.folded) over a row of 1,024, as a
    real checkpoint's rows are specialised (16-divisible): the weight rows load 16 bytes a
    thread, GLU's second half (the up rows) as the first, once for all the rows; the SwiGLU
    product compiles."""
    kernel = load_allele("norm_mlp", "folded").norm_linear_kernel
    ptx = sm90_ptx(kernel, dict(BLOCK_N=8 if glu else 16, BLOCK_K=1024, RESIDUAL=True, GLU=glu, PDL=True, ROWS=rows),
                   num_stages=1, divisible=("num_out", "num_in"), eps="fp32")
    loads = re.findall(r"ld\.global[\w.]*", ptx)
    # 16 x 1,024 fp16 weights (GLU: 8 rows of each half) over 128 threads, 8 a load: 16 loads
    # a thread; one for the norm's weight, and for each row one each for x and the residual
    assert loads.count("ld.global.v4.b32") == 16 + 1 + 2 * rows and len(loads) == 17 + 2 * rows, loads
    assert ("div.rn.f32" in ptx) == glu


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_rope_rounds_each_product_before_the_sum_on_sm_90(dtype):
    """torch rounds x0 * cos and x1 * sin to the compute dtype before their sum. A product
    written without a rounding mode lets ptxas fuse it with the 16-bit add after its cast into
    one FMA (on an H100 1 in 5 bf16 outputs differed from torch's): every multiply of the RoPE
    kernels is mul.rn, which is not fused."""
    def pointers(*names):
        return {name: f"*{dtype}" for name in names}
    rope = dict(constants=dict(HALF=96, BLOCK_H=4, BLOCK_P=128), num_stages=1,
                **pointers("x_ptr", "cos_ptr", "sin_ptr", "out_ptr"))
    kernels = [(load_allele("apply_rope", "triton_rows").rope_rows_kernel, rope),
               (load_allele("apply_rope", "triton").rope_kernel, rope),
               (load_allele("attention_inputs", "triton").attention_inputs_kernel,
                dict(constants=dict(HALF=48, BLOCK_QH=4, BLOCK_KH=4, BLOCK_P=64, NORM=False, WRITE=True, PAGE_SIZE=16),
                     num_stages=2, slots_ptr="*i64", offsets_ptr="*i64", eps="fp32",
                     **pointers("q_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr", "k_pool_ptr", "v_pool_ptr")))]
    for kernel, how in kernels:
        multiplies = re.findall(r"\b(?:mul|fma)(?:\.\w+)*\.f32\b", sm90_ptx(kernel, **how))
        assert multiplies and all(m.startswith("mul.rn") for m in multiplies), (kernel.fn.__name__,
                                                                                sorted(set(multiplies)))


def test_wide_heads_are_readied_in_the_split_kv_kernel_only_where_its_splits_prefetch():
    """Above head_dim 128, attention.split_kv's readying kernel without its first tile loaded
    before the wait failed to compile on the GPU machine's Triton (3.6; this machine's compiles
    it, so the test above cannot see it): such a batch keeps attention_inputs apart, and a
    search that raises READY_BATCH alone judges a slower program, not a crash."""
    fused = load_allele("attention", "split_kv")
    taken = []
    fused.attention_inputs = lambda q, k, *rest: taken.append("apart") or (q, k)
    fused.attend_decode = lambda q, k, v, cache, index, step: q
    fused.split_kv_attention = lambda q, cache, index, step, ready: taken.append("ready") or q
    fused.READY_BATCH, fused.DECODE_PREFETCH_BATCH = 8, 2
    cache, step = SimpleNamespace(reference_rounding=False), SimpleNamespace(is_decode=True)
    for head_dim, batch in [(192, 2), (192, 3), (128, 3), (256, 8)]:
        q = torch.zeros(batch, 4, head_dim, dtype=torch.float16)
        fused.attention(q, q, q, {}, q[:, 0, :head_dim // 2], q[:, 0, :head_dim // 2], cache, step, 0, 1e-6)
    assert taken == ["ready", "apart", "ready", "apart"]


def test_the_cache_row_writes_run_no_64_bit_division_on_sm_90():
    """attention_inputs.triton and paged_chunks write a token's K/V row where shared.slot_row
    finds it: a constexpr page size and a shift, no division routine in a batch-1 step."""
    writes = load_allele("attention_inputs", "triton").attention_inputs_kernel
    ptx = sm90_ptx(writes, dict(HALF=64, BLOCK_QH=16, BLOCK_KH=8, BLOCK_P=64, NORM=True, WRITE=True, PAGE_SIZE=16),
                   num_stages=2, slots_ptr="*i64", offsets_ptr="*i64", eps="fp32")
    assert not divisions(ptx)
    rows = load_allele("KVCache", "paged_chunks").write_rows_kernel
    assert not divisions(sm90_ptx(rows, dict(PAGE_SIZE=16, ROW=1024, BLOCK=1024), num_stages=2, slots_ptr="*i64",
                                  offsets_ptr="*i64"))


@pytest.mark.skipif(os.environ.get("MUTATIONS_SLOW") != "1", reason="about 45 s per allele; MUTATIONS_SLOW=1 runs it")
@pytest.mark.parametrize("operator", INTERPRETED)
def test_triton_child_passes_the_gate_traces_interpreted(operator, small_target, scratch):
    """The whole child engine on the gate's cheap traces plus GQA, head_dim 256 and the
    Hugging Face families' features, with its Triton kernels interpreted on CPU."""
    config_path, weight_dir = small_target
    done = interpreted(FIXTURES / "interpret_gate.py", config_path, weight_dir, scratch, operator, timeout=600)
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["passed"], verdict


@pytest.mark.skipif(os.environ.get("MUTATIONS_SLOW") != "1", reason="about 100 s per allele; MUTATIONS_SLOW=1 runs it")
@pytest.mark.parametrize("operator", ["allele.moe.triton_grouped", "allele.route.triton_topk"])
def test_moe_triton_child_passes_the_gate_traces_interpreted(operator, tmp_path):
    """The seed with one MoE Triton allele, on the tiny Qwen3-MoE's gate traces (and its GQA,
    head_dim 256 and families configs), its kernels interpreted on CPU."""
    from target import hf_checkpoints
    folder = hf_checkpoints.write(tmp_path, "tiny_qwen3_moe")
    done = interpreted(FIXTURES / "interpret_gate.py", folder / "config.json", folder, tmp_path / "scratch", operator,
                       timeout=900)
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["passed"], verdict


@pytest.mark.parametrize("sorted_", [False, True])
def test_the_moe_kernels_compile_for_sm_90_on_the_tensor_cores(sorted_):
    """moe.triton_grouped's two kernels, by rank and sorted, and route.triton_topk's, compiled
    for an H100 in bf16: their dots are tensor-core MMAs (the interpreter runs neither branch
    as a GPU compiles it)."""
    module = load_allele("moe", "triton_grouped")
    pointers = {name: "*bf16" for name in ("x_ptr", "h_ptr", "gate_ptr", "up_ptr", "down_ptr", "weights_ptr", "out_ptr")}
    pointers.update({name: "*i64" for name in ("ids_ptr", "order_ptr", "counts_ptr", "starts_ptr")})
    constants = dict(NUM_BINS=256, BLOCK_P=1 if sorted_ else 512, SORTED=sorted_, BLOCK_M=16, BLOCK_N=64, BLOCK_K=64,
                     PRECISION="tf32")
    for kernel in (module.experts_gate_up_kernel, module.experts_down_kernel):
        assert "mma.sync" in sm90_ptx(kernel, constants, num_stages=3, top_k="i32", width="i32", **pointers)
    route = load_allele("route", "triton_topk").route_kernel
    assert sm90_ptx(route, dict(TOP_K=8, BLOCK_K=8, BLOCK_E=128, RENORMALISE=True), num_stages=1,
                    logits_ptr="*bf16", weights_ptr="*bf16", experts_ptr="*i64")
