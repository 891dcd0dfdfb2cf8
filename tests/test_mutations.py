"""Every operator on the seed: drop-in alleles, the CPU gate, determinism, declines, requirements,
crossover, and the command line."""
import json
import random
import subprocess
import sys

import pytest
import torch

import mutations
from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from fitness.gate import check_module, static_problems
from mutations import alleles, program, requirements
from tests.conftest import REPO, SEED_ENGINE, SMALL_CONFIG, in_gpu_dtype, write_weights

SEED = SEED_ENGINE.read_text()
CPU_OPERATORS = [op.name for op in mutations.all_operators() if op.can_run_on("cpu")]
ALL_OPERATORS = [op.name for op in mutations.all_operators()]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread is as fast, and immune to oversubscription on a shared box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def applied_to_seed(name, seed=0):
    """The operator on the seed, or, for one that needs what the seed lacks, on the seed
    after the swap that brings it (its `needs_swap`)."""
    return mutations.get_operator(name).apply(mutations.with_work_for(name, SEED), random.Random(seed))


def gate(source, small_target, scratch, tmp_path, derived=True):
    config_path, weight_dir = small_target
    path = tmp_path / "child.py"
    path.write_text(source)
    return check_module(load_engine_module(path), ModelConfig.load(config_path), weight_dir, "cpu", 5, scratch,
                        derived=derived)


# The seed allele of a gene whose one other allele needs GPU genes: on the seed after that
# swap (its needs_swap) it puts the seed's code back and leaves those genes on the GPU.
LEAVES_GPU_GENES = {"allele.attention.seed": ["KVCache", "attend_decode"]}


def gpu_genes(source):
    """The genes of `source` that carry a GPU-only allele."""
    carried = program.gene_alleles(program.parse(source))
    return sorted(g for g, a in carried.items() if a != program.SEED_ALLELE and alleles.get(g, a).devices == "cuda")


@pytest.mark.parametrize("name", CPU_OPERATORS)
def test_cpu_operator_on_the_seed_passes_the_gate(name, small_target, scratch, tmp_path):
    result = applied_to_seed(name)
    assert isinstance(result, mutations.Applied), result
    assert static_problems(result.source) == []
    assert gpu_genes(result.source) == LEAVES_GPU_GENES.get(name, [])
    if name in LEAVES_GPU_GENES:
        pytest.skip(f"{name} on the seed after its needs_swap leaves {LEAVES_GPU_GENES[name]} on the GPU")
    verdict = gate(result.source, small_target, scratch, tmp_path)
    assert verdict.passed, (name, verdict.error)


@pytest.mark.parametrize("name", ALL_OPERATORS)
def test_operator_is_deterministic_and_names_itself(name):
    first, second = applied_to_seed(name, seed=3), applied_to_seed(name, seed=3)
    assert first == second
    if isinstance(first, mutations.Applied):
        assert first.operator == name
        json.dumps(first.args)
        assert static_problems(first.source) == []


@pytest.mark.parametrize("name", ALL_OPERATORS)
def test_operator_declines_instead_of_returning_its_input(name):
    """Applied over and over, an operator runs out of things to rewrite and says so."""
    op = mutations.get_operator(name)
    source = SEED if name == "tune_constant" else applied_to_seed(name).source
    for step in range(10):
        result = op.apply(source, random.Random(step))
        if isinstance(result, mutations.Declined):
            assert result.reason and op.applies(source) == result.reason
            return
        assert result.source != source
        source = result.source
    pytest.fail(f"{name} still applies after 10 rounds")


def test_broken_source_is_declined_not_raised():
    for op in mutations.all_operators():
        assert isinstance(op.apply("def broken(:\n", random.Random(0)), mutations.Declined)


def signature(node):
    return [p.name.value for p in node.params.params]


@pytest.mark.parametrize("key", sorted(k for k in alleles.library() if k[1] != "seed"))
def test_allele_is_drop_in(key):
    """Same name and parameters as the seed's gene; a class keeps every public method's."""
    gene, name = key
    seed_def = program.definitions(program.seed_module())[gene]
    allele_def = alleles.get(gene, name).definition()
    assert type(allele_def) is type(seed_def)
    if isinstance(seed_def, program.cst.FunctionDef):
        assert signature(allele_def) == signature(seed_def)
        return
    methods = {s.name.value: s for s in allele_def.body.body if isinstance(s, program.cst.FunctionDef)}
    for method in seed_def.body.body:
        if isinstance(method, program.cst.FunctionDef):
            assert method.name.value in methods, f"{gene}.{name} lacks {method.name.value}"
            assert signature(methods[method.name.value]) == signature(method)


def test_every_requirement_names_real_alleles():
    for (gene, name), allele in alleles.library().items():
        for needed, allowed in allele.requires.items():
            assert needed in program.GENES
            for other in allowed:
                assert alleles.get(needed, other), f"{gene}.{name} requires unknown {needed}.{other}"


def test_allele_helpers_do_not_clash():
    """A helper name two alleles (or an allele and the seed) share means the same code."""
    seen = {name: program.code(stmt) for name, stmt in program.definitions(program.seed_module()).items()}
    for (gene, name), allele in sorted(alleles.library().items()):
        if name == "seed":
            continue
        for helper, stmt in program.definitions(allele.module).items():
            if helper in program.GENES:
                continue
            text = program.code(stmt.with_changes(leading_lines=[]))
            other = seen.setdefault(helper, text)
            assert program.code(program.parse(other).body[0].with_changes(leading_lines=[])) == text \
                if other != text else True, f"{gene}.{name} redefines {helper}"


def test_swap_records_the_allele_and_settles_requirements():
    child = mutations.get_operator("allele.attend_decode.table_sdpa").apply(SEED, random.Random(0))
    carried = program.gene_alleles(program.parse(child.source))
    assert carried["attend_decode"] == "table_sdpa" and carried["KVCache"] == "slab"
    assert child.args["repairs"] == {"KVCache": "slab"}
    assert "# allele: table_sdpa\ndef attend_decode" in child.source
    # Swapping the cache back to the seed's sends the decode attention back too.
    back = mutations.get_operator("allele.KVCache.seed").apply(child.source, random.Random(0))
    carried = program.gene_alleles(program.parse(back.source))
    assert carried["KVCache"] == "seed" and carried["attend_decode"] == "seed"
    assert requirements.first_violation(carried) is None


def test_swap_brings_helpers_and_prunes_dead_ones():
    child = mutations.get_operator("allele.attend_decode.table_sdpa").apply(SEED, random.Random(0)).source
    for helper in ("def table_attention", "def sdpa", "def masked_attention"):  # shared.py, then the seed
        assert child.count(helper) == 1, helper
    assert child.index("def sdpa") < child.index("def table_attention") < child.index("def attend_decode")
    child = mutations.get_operator("allele.attend_decode.gather_sdpa").apply(child, random.Random(0)).source
    assert "def table_attention" not in child  # nothing uses it any more
    back = mutations.get_operator("allele.attend_decode.seed").apply(child, random.Random(0)).source
    assert "def sdpa" not in back and back.count("def masked_attention") == 1


def test_cuda_operators_stay_off_cpu_walks():
    rng = random.Random(0)
    for _ in range(30):
        result = mutations.random_mutation(SEED, rng, "cpu")
        assert mutations.get_operator(result.operator).devices == "any"
    # Which operators are cuda-only is each one's own declaration (an allele's DEVICES): what
    # is checked is that the declaration is true, with no list to keep here.
    cuda_only = {op.name for op in mutations.all_operators() if op.devices == "cuda"}
    assert {"torch_compile", "programmatic_launch", "prefetched_linears", "allele.mlp.swiglu_triton"} <= cuda_only
    for name in cuda_only:  # only they may import triton; CPU programs never need it
        assert "import triton" in applied_to_seed(name).source or name == "torch_compile"
    for name in set(CPU_OPERATORS) - set(LEAVES_GPU_GENES):
        assert "triton" not in applied_to_seed(name).source


def test_crossover_is_uniform_over_genes_and_closed_under_requirements():
    a = mutations.get_operator("allele.attend_decode.table_sdpa").apply(SEED, random.Random(0)).source  # slab + table
    b = mutations.get_operator("allele.load_weights.fused_both").apply(SEED, random.Random(0)).source
    b = mutations.get_operator("allele.attend_prefill.padded_sdpa").apply(b, random.Random(0)).source
    origins = []
    for seed in range(30):
        child = mutations.crossover(a, b, random.Random(seed))
        if isinstance(child, mutations.Declined):
            continue
        assert child.operator == "crossover"
        json.dumps(child.args)
        carried = program.gene_alleles(program.parse(child.source))
        assert requirements.first_violation(carried) is None, carried
        assert static_problems(child.source) == []
        assert set(child.args["genes"].values()) <= {"a", "b"}
        origins.append(child.args["genes"])
        assert mutations.crossover(a, b, random.Random(seed)) == child  # deterministic
    assert len({json.dumps(o, sort_keys=True) for o in origins}) > 5


def test_crossover_of_paged_attention_and_per_request_cache_is_repaired():
    a = mutations.get_operator("allele.attend_decode.table_sdpa").apply(SEED, random.Random(0)).source
    for seed in range(20):
        child = mutations.crossover(a, SEED, random.Random(seed))
        if isinstance(child, mutations.Applied):
            carried = program.gene_alleles(program.parse(child.source))
            assert not (carried["attend_decode"] == "table_sdpa" and carried["KVCache"] == "seed")


@pytest.mark.parametrize("mlp", ["fused", "swiglu_triton"])
def test_a_merge_needing_an_allele_neither_parent_carries_takes_it_from_the_library(mlp):
    # Fused q/k/v needs load_weights in (fused_qkv, fused_both), a fused gate/up MLP needs it
    # in (fused_gate_up, fused_both): merged, only fused_both serves both. Without it the
    # stronger gain took the gene and the weaker went (two H100 searches' winners).
    qkv = mutations.get_operator("allele.qkv_proj.fused").apply(SEED, random.Random(0)).source
    gate_up = mutations.get_operator(f"allele.mlp.{mlp}").apply(SEED, random.Random(0)).source
    for a, b, genes in ((qkv, gate_up, {"mlp"}), (gate_up, qkv, {"qkv_proj"})):
        child = mutations.merge_gains(a, b, SEED, random.Random(0), genes)
        assert isinstance(child, mutations.Applied), child
        carried = program.gene_alleles(program.parse(child.source))
        assert (carried["load_weights"], carried["qkv_proj"], carried["mlp"]) == ("fused_both", "fused", mlp)
        assert child.args["repairs"] == {"load_weights": "library"}
        assert static_problems(child.source) == []
    both = mutations.get_operator("allele.load_weights.fused_both").apply(SEED, random.Random(0)).source
    assert child.source == (both if mlp == "fused" else
                            mutations.get_operator(f"allele.mlp.{mlp}").apply(both, random.Random(0)).source)


def test_a_program_under_programmatic_launch_keeps_every_kernel_under_it():
    # An H100 search swapped the RoPE kernel of a program under PDL: the shared launcher
    # passed the flag to the new kernel, which had no such parameter, and it crashed. A
    # merge that gives such a program the gene of one not under PDL is the same.
    from mutations.rewrites.programmatic_launch import kernels_without_flag
    rope = mutations.get_operator("allele.apply_rope.triton").apply(SEED, random.Random(0)).source
    under = mutations.get_operator("programmatic_launch").apply(rope, random.Random(0)).source
    rows = mutations.get_operator("allele.apply_rope.triton_rows").apply(SEED, random.Random(0)).source
    swapped = mutations.get_operator("allele.apply_rope.triton_rows").apply(under, random.Random(0)).source
    merged = mutations.merge_gains(under, rows, SEED, random.Random(0), {"apply_rope"})
    assert isinstance(merged, mutations.Applied), merged
    for source in (swapped, merged.source):
        module = program.parse(source)
        assert program.gene_alleles(module)["apply_rope"] == "triton_rows"
        assert kernels_without_flag(module) == []
        assert "launch_rope(rope_rows_kernel, x, cos, sin)" in source and "PDL=PDL_LAUNCH" in source
        assert static_problems(source) == []
    # A program not under PDL takes none from a swap.
    assert "PDL" not in mutations.get_operator("allele.apply_rope.triton_rows").apply(rope, random.Random(0)).source


def test_crossover_of_identical_parents_declines():
    assert isinstance(mutations.crossover(SEED, SEED, random.Random(0)), mutations.Declined)


def test_random_mutation_declines_when_nothing_applies():
    result = mutations.random_mutation("x = 1\n", random.Random(0), "cpu")
    assert isinstance(result, mutations.Declined)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "mutations", *args], cwd=REPO, capture_output=True, text=True)


def test_cli_list_apply_cross(tmp_path):
    listed = run_cli("list").stdout.splitlines()
    assert len(listed) == len(ALL_OPERATORS) and listed[0].split()[0] == ALL_OPERATORS[0]
    out = tmp_path / "child.py"
    done = run_cli("apply", "allele.KVCache.paged", str(SEED_ENGINE), "--seed", "1", "-o", str(out))
    assert done.returncode == 0 and "allele.KVCache.paged" in done.stderr and "# allele: paged" in out.read_text()
    crossed = run_cli("cross", str(SEED_ENGINE), str(out), "--seed", "2")
    assert crossed.returncode in (0, 1) and ("crossover" in crossed.stderr)
    declined = run_cli("apply", "last_token_logits", str(SEED_ENGINE))
    assert declined.returncode == 0
    assert run_cli("apply", "no_such_operator", str(SEED_ENGINE)).returncode == 2


def test_every_rewrite_module_has_a_description_and_docstring():
    for op in mutations.all_operators():
        assert op.description and "\n" not in op.description
        module = sys.modules[type(op).__module__]
        assert module.__doc__ and len(module.__doc__.splitlines()) > 2


def test_a_paged_pool_starts_the_same_whatever_max_positions_and_doubles_with_need(tmp_path):
    """The first pool is POOL_PAGES pages, not a multiple of max_position_embeddings; a
    trace that needs more doubles it, and logits stay the seed's."""
    source = mutations.get_operator("allele.KVCache.paged").apply(SEED, random.Random(0)).source
    source = mutations.get_operator("tune_constant").replay(source, {"constant": "POOL_PAGES", "new": 16}).source
    (tmp_path / "paged.py").write_text(source)
    pools = []
    for max_positions in (1024, 8192):
        config = {**SMALL_CONFIG, "max_position_embeddings": max_positions}
        write_weights(config, tmp_path / f"w{max_positions}" / "model.pt", seed=5)
        engines = [load_engine_module(path).create_engine(dict(config), str(tmp_path / f"w{max_positions}"), "cpu")
                   for path in (tmp_path / "paged.py", SEED_ENGINE)]
        pools.append(engines[0].cache.k[0].shape[0])
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (5, 300)]  # 1 + 19 pages of 16
        with torch.no_grad():
            outs = [e.prefill([0, 1], prompts) for e in engines]
            tokens = torch.randint(0, 256, (2,), generator=gen)
            outs += [e.decode([0, 1], tokens) for e in engines]
        cache = engines[0].cache
        assert cache.k[0].shape[0] == 34 and cache.generation == 1  # 1 scratch + 16, doubled once
        for paged, seed in zip(outs[::2], outs[1::2]):
            torch.testing.assert_close(paged, seed, rtol=1e-4, atol=1e-4)
    assert pools == [17, 17]


@pytest.mark.parametrize("operator", ["allele.KVCache.slab", "allele.Engine.cuda_graphs"])
def test_a_slab_grows_its_rows_with_the_longest_request(operator, tmp_path):
    """A request longer than the slab's rows: it grows (graphs captured again), logits stay
    the seed's, and the slab never takes max_position_embeddings rows for every slot."""
    config = {**SMALL_CONFIG, "max_position_embeddings": 1024}
    write_weights(config, tmp_path / "weights" / "model.pt", seed=5)
    source = mutations.get_operator(operator).apply(SEED, random.Random(0)).source
    if "# allele: slab" not in source:
        source = mutations.get_operator("allele.KVCache.slab").apply(source, random.Random(0)).source
    (tmp_path / "slab.py").write_text(source)
    engines = [load_engine_module(path).create_engine(dict(config), str(tmp_path / "weights"), "cpu")
               for path in (tmp_path / "slab.py", SEED_ENGINE)]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (5, 300)]
    with torch.no_grad():
        outs = [e.prefill([0, 1], prompts) for e in engines]
        for _ in range(3):
            tokens = torch.randint(0, 256, (2,), generator=gen)
            outs += [e.decode([0, 1], tokens) for e in engines]
    cache = engines[0].cache
    assert cache.page_size == cache.k[0].shape[1] == 512  # 256 rows, doubled once for 303 tokens
    assert cache.k[0].shape[0] * cache.k[0].shape[1] < 16 * 1024
    with torch.no_grad():  # the long one gone, 20 more short ones: more slots, and rows fitted again
        for e in engines:
            e.remove([1])
        short = [torch.randint(0, 256, (3,), generator=gen) for _ in range(20)]
        outs += [e.prefill(list(range(2, 22)), short) for e in engines]
        tokens = torch.randint(0, 256, (21,), generator=gen)
        outs += [e.decode([0, *range(2, 22)], tokens) for e in engines]
    assert cache.k[0].shape[:2] == (32, 256)
    for slab, seed in zip(outs[::2], outs[1::2]):
        torch.testing.assert_close(slab, seed, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("constant, dtype", [("GRAPH_MAX_POSITIONS", "float16"),
                                             ("ROUNDED_GRAPH_POSITIONS", "bfloat16")])
def test_decodes_past_the_graphs_width_run_eagerly(constant, dtype, tmp_path):
    """A decode graph's block table is GRAPH_MAX_POSITIONS wide (ROUNDED_GRAPH_POSITIONS
    where attention rounds like the contract's bf16 reference and pays for the whole
    table), not max_position_embeddings (Llama 3.2's 131,072 made one captured step attend
    over all of it): a request past it decodes eagerly, shorter batches through the static
    path, and both give the seed's logits."""
    config = {**SMALL_CONFIG, "max_position_embeddings": 1024, "torch_dtype": dtype}
    write_weights(config, tmp_path / "weights" / "model.pt", seed=6)
    seed = SEED if dtype == "float16" else in_gpu_dtype(SEED)
    source = mutations.get_operator("allele.Engine.cuda_graphs").apply(seed, random.Random(0)).source
    source = mutations.get_operator("tune_constant").replay(source, {"constant": constant, "new": 256}).source
    (tmp_path / "graphs.py").write_text(source)
    (tmp_path / "seed.py").write_text(seed)
    engines = [load_engine_module(path).create_engine(dict(config), str(tmp_path / "weights"), "cpu")
               for path in (tmp_path / "graphs.py", tmp_path / "seed.py")]
    graphs = engines[0]
    assert graphs.cache.reference_rounding == (dtype == "bfloat16")
    assert graphs.static["block_table"].shape[1] == 256 // graphs.cache.page_size < graphs.cache.max_pages
    eager_calls = []
    eager = graphs.forward
    graphs.forward = lambda *args: eager_calls.append(1) or eager(*args)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (5, 250)]
    with torch.no_grad():
        outs = [e.prefill([0, 1], prompts) for e in engines]
        prefills = len(eager_calls)
        for _ in range(8):  # request 1 crosses position 256 on the 7th step
            tokens = torch.randint(0, 256, (2,), generator=gen)
            outs += [e.decode([0, 1], tokens) for e in engines]
        assert len(eager_calls) - prefills == 2  # positions 256 and 257
        for e in engines:
            e.remove([1])
        tokens = torch.randint(0, 256, (1,), generator=gen)
        outs += [e.decode([0], tokens) for e in engines]
        assert len(eager_calls) - prefills == 2  # the short one alone: the static path again
    tolerance = 1e-4 if dtype == "float16" else 2e-2  # bf16: matmuls of other shapes round apart
    for graphed, seed in zip(outs[::2], outs[1::2]):
        torch.testing.assert_close(graphed.float(), seed.float(), rtol=tolerance, atol=tolerance)


def test_a_programs_imports_are_ordered_by_group_then_module():
    source = ('"""doc"""\nimport triton\nimport torch\n# the pool\nimport array\n'
              'from __future__ import annotations\n\nX = 1\n')
    ordered = program.ordered_imports(program.parse(source)).code
    assert ordered == ('"""doc"""\nfrom __future__ import annotations\n\n# the pool\nimport array\n\nimport torch\n'
                       'import triton\n\nX = 1\n')
