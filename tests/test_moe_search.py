"""The search on a Qwen3-MoE target: every operator a CPU search can draw keeps a sparse layer's
router and experts, the MoE alleles compute what the seed's genes compute, and a search on a
dense target leaves the MoE genes alone.

Judging each operator's child alone would cost a gate each (34 operators); instead a few
programs between them carry every CPU allele (alleles of different genes compose) and then
every CPU rewrite that applies to them, and each is judged on tiny Qwen3-MoE checkpoints
saved by transformers (tests/test_moe.py's), fp32 and bf16. Crossover and merges only put
genes of such programs together."""
import random

import pytest
import torch

import mutations
from contract.families import idle_genes, own_genes, qwen3_moe
from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from evolve.memo import Memo
from evolve.operators import OWN, OperatorSelector, sweep_rank
from evolve.toolbox import Program, Vocabulary, open_operators, sweep
from fitness.gate import GateFailure, check_module
from mutations import program
from tests.conftest import SEED_ENGINE
from tests.test_moe import make_checkpoint

SEED = SEED_ENGINE.read_text()
CPU_OPERATORS = [op for op in mutations.all_operators() if op.can_run_on("cpu")]
SWAPS = [op for op in CPU_OPERATORS if op.kind == "allele" and op.allele.name != program.SEED_ALLELE]
REWRITES = [op for op in CPU_OPERATORS if op.kind == "structural"]


def carried(source) -> set:
    return set(program.gene_alleles(program.parse(source)).items())


def program_with(swaps) -> str:
    """The seed after each swap of `swaps` that keeps every allele an earlier one placed (a
    swap's requirements may send another gene back to the seed)."""
    source, placed = SEED, set()
    for op in swaps:
        if op.allele.gene in dict(placed):
            continue
        child = op.apply(source, random.Random(0))
        if isinstance(child, mutations.Applied) and placed <= carried(child.source):
            source = child.source
            placed.add((op.allele.gene, op.allele.name))
    return source


def rewritten(source, index) -> tuple:
    """(source after every CPU rewrite that applies, repeated until it declines, except
    tune_constant once with a draw of its own; the rewrites applied)."""
    applied = set()
    for op in REWRITES:
        for step in range(1 if op.name == "tune_constant" else 4):
            child = op.apply(source, random.Random(index * 10 + step))
            if not isinstance(child, mutations.Applied):
                break
            source = child.source
            applied.add(op.name)
    return source, applied


def covering_programs() -> list:
    """(source, operators in it): the seed and a few programs that between them carry every
    CPU allele, each then rewritten by every CPU rewrite that applies."""
    left, programs = list(SWAPS), [SEED]
    while left:
        source = program_with(left)
        covered = [op for op in left if (op.allele.gene, op.allele.name) in carried(source)]
        assert covered, f"no program carries {[op.name for op in left]}"
        left = [op for op in left if op not in covered]
        programs.append(source)
    made = []
    for index, source in enumerate(programs):
        source, applied = rewritten(source, index)
        made.append((source, applied | {f"allele.{g}.{a}" for g, a in carried(source)}))
    return made


@pytest.fixture(scope="module")
def programs():
    return covering_programs()  # ~16 s on a 2-core CPU: every swap and rewrite is a libcst pass


def test_the_programs_cover_every_operator_a_cpu_search_draws(programs):
    covered = set().union(*(operators for _, operators in programs))
    assert {op.name for op in CPU_OPERATORS} - covered == set()
    assert len(programs) <= 5  # a gate each, per checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: make_checkpoint(tmp_path_factory.mktemp(f"moe_{name}"), dtype)
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_cpu_operator_keeps_a_sparse_model_correct(programs, checkpoints, scratch, tmp_path, dtype):
    folder = checkpoints[dtype]
    failed = []
    for index, (source, operators) in enumerate(programs):
        path = tmp_path / f"program{index}.py"
        path.write_text(source)
        try:
            verdict = check_module(load_engine_module(path), ModelConfig.load(folder), folder, "cpu", 5, scratch,
                                   derived=False)
        except GateFailure as err:  # the program raised
            failed.append((sorted(operators), str(err)))
            continue
        failed += [] if verdict.passed else [(sorted(operators), verdict.error)]
    assert failed == []


# --- the MoE alleles against the seed's genes --------------------------------------------------

def seed_with(name):
    """The seed's namespace with the swap `name` made."""
    namespace = {}
    exec(compile(mutations.get_operator(name).apply(SEED, random.Random(0)).source, name, "exec"), namespace)
    return namespace


def sparse_layer(dtype, renormalise, num_experts=8, hidden=32, inter=16):
    gen = torch.Generator().manual_seed(3)

    def draw(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(dtype)
    return {"router": draw(num_experts, hidden), "experts_gate": draw(num_experts, inter, hidden),
            "experts_up": draw(num_experts, inter, hidden), "experts_down": draw(num_experts, hidden, inter),
            "top_k": 2, "renormalise": renormalise}


SEED_GENES = seed_with("allele.moe.gathered_bmm")  # any swap: the seed's genes beside it
# Rows: one token, a few, and more than either moe allele's bound at its default (both paths).
ROWS = (1, 5, 600)


@pytest.mark.parametrize("name", ["allele.moe.gathered_bmm", "allele.moe.padded_bmm",
                                  "allele.experts_swiglu.routed_only", "allele.route.fused_topk"])
@pytest.mark.parametrize("renormalise", [True, False])
def test_a_moe_allele_computes_the_seeds_sparse_mlp(name, renormalise):
    """fp32: the seed's moe to rounding. bf16: no further from the fp32 result than the seed's
    own bf16 moe is (twice its error), with the same routing."""
    allele = seed_with(name)
    gen = torch.Generator().manual_seed(4)
    for rows in ROWS:
        x = torch.randn(rows, 32, generator=gen)
        exact = SEED_GENES["moe"](x, sparse_layer(torch.float32, renormalise))
        torch.testing.assert_close(allele["moe"](x, sparse_layer(torch.float32, renormalise)), exact,
                                   atol=1e-5, rtol=1e-5)
        layer = sparse_layer(torch.bfloat16, renormalise)
        x16 = x.to(torch.bfloat16)
        assert torch.equal(allele["route"](x16, layer)[1], SEED_GENES["route"](x16, layer)[1])
        seed_error = (SEED_GENES["moe"](x16, layer).float() - exact).abs().max()
        assert (allele["moe"](x16, layer).float() - exact).abs().max() <= 2 * seed_error, (name, rows)



def test_a_search_swaps_moe_genes_on_a_moe_target_only(small_target, checkpoints):
    """On a dense model no trace runs the MoE genes (the gate's derived configs leave
    structural features off): a swap of one would be judged for nothing."""
    seed = Program(SEED)

    def open_on(config_path):
        vocabulary = Vocabulary(mutations, mutations.random_mutation, mutations.crossover,
                                idle_genes(ModelConfig.load(config_path)))
        return set(open_operators(seed, vocabulary, Memo(), "cpu"))
    dense, sparse = open_on(small_target[0]), open_on(checkpoints["fp32"])
    moe_swaps = {op.name for op in SWAPS if op.allele.gene in qwen3_moe.SEED_GENES}
    assert moe_swaps and moe_swaps <= sparse and not moe_swaps & dense
    assert sparse - moe_swaps == dense


def test_a_sweep_on_a_moe_target_makes_the_moe_swaps_first(small_target, checkpoints):
    """A 20-minute search from the seed on 4 layers of Qwen3-30B-A3B drew 7 of the 18 GPU-only
    operators at random, none of them the MoE's (the seed's step 59x the hand-composed
    program's), and returned the seed. On a dense target the order is as before."""
    seed, config, dense = Program(SEED), ModelConfig.load(checkpoints["fp32"]), ModelConfig.load(small_target[0])
    assert not own_genes(dense)
    for device in ("cuda", "cpu"):
        vocabulary = Vocabulary(mutations, mutations.random_mutation, mutations.crossover,
                                idle_genes(config), own_genes(config))
        names = open_operators(seed, vocabulary, Memo(), device)
        moe = {n for n in names if vocabulary.gene_of(n) in qwen3_moe.SEED_GENES}
        assert moe and all(sweep_rank(n, device, vocabulary) == OWN for n in moe)
        children = sweep(seed, len(moe), Program, vocabulary, OperatorSelector(), Memo(), random.Random(0),
                         device, levers_only=True)
        assert {c.operator for c in children} == moe, device
        if device == "cuda":
            assert "allele.moe.triton_grouped" in moe
        vocabulary = Vocabulary(mutations, mutations.random_mutation, mutations.crossover,
                                idle_genes(dense), own_genes(dense))
        assert OWN not in {sweep_rank(n, device, vocabulary) for n in open_operators(seed, vocabulary, Memo(), device)}
