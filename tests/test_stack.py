"""The stack (evolve/stack.py): generation 1's first child on a GPU, every lever at once."""
import random
from types import SimpleNamespace

import pytest

import mutations
from contract.families import idle_genes, own_genes
from contract.loader import source_hash
from contract.model_config import ModelConfig
from evolve import history
from evolve.loop import Breeding, Budget, breed
from evolve.operators import Vocabulary
from evolve.program import Program
from evolve.recipe import lineage_recipe
from evolve.stack import STACK, stack
from evolve.memo import Memo
from evolve.toolbox import make_toolbox, open_operators
from evolve.workspace import format_lineage
from mutations import program, recipe
from target.hf_checkpoints import QWEN3_30B_A3B
from tests.conftest import REPO, SEED_ENGINE
from tests.test_recipes import HistoryBuilder

SEED = SEED_ENGINE.read_text()
MOE = ModelConfig.from_dict(dict(QWEN3_30B_A3B))
# Alternatives of one gene (two MoEs, two graphs Engines), two folds whose requirements on the
# loaded weights differ, a rewrite of a gene a swap took, and a drawn move.
NAMES = ["allele.moe.padded_bmm", "allele.moe.triton_grouped", "allele.route.triton_topk", "allele.Engine.cuda_graphs",
         "allele.Engine.cuda_graphs_prefill", "allele.norm_qkv.folded", "allele.norm_mlp.folded", "last_token_logits",
         "tune_constant"]


def vocabulary() -> Vocabulary:
    return Vocabulary(mutations, mutations.random_mutation, mutations.crossover, idle_genes(MOE), own_genes(MOE))


@pytest.fixture(scope="module")
def stacked():
    return stack(SEED, NAMES, vocabulary(), "cuda", random.Random(0))


def test_a_stack_keeps_each_gene_s_first_taker_kernels_first_and_the_program_wide_rewrites_last(stacked):
    assert isinstance(stacked, mutations.Applied) and stacked.operator == STACK
    steps = [step.operator for step in recipe.parse("\n".join(stacked.args["steps"]))]
    # The GPU's MoE and graphs, not the portable ones of the same genes; no drawn move.
    assert {"allele.moe.triton_grouped", "allele.route.triton_topk", "allele.Engine.cuda_graphs_prefill"} <= set(steps)
    assert not {"allele.moe.padded_bmm", "allele.Engine.cuda_graphs", "tune_constant"} & set(steps)
    # Both folds: their requirements settle on the weights both admit.
    assert {"allele.norm_qkv.folded", "allele.norm_mlp.folded", "last_token_logits"} <= set(steps)
    assert program.gene_alleles(program.parse(stacked.source))["load_weights"] == "fused_both"
    # Once the stack runs kernels in graphs, the program-wide rewrites, last.
    assert steps[-1] == "prefetched_linears" and steps.index("last_token_logits") < steps.index("prefetched_linears")
    # Its recipe lines make it from the seed.
    assert recipe.apply(recipe.parse("\n".join(stacked.args["steps"])), SEED) == stacked.source


def test_a_stack_s_lineage_is_written_as_its_steps(stacked, tmp_path):
    built = HistoryBuilder(tmp_path)
    built.add(stacked.source, (SEED,), STACK, stacked.args, 2.0)
    frame = history.read(built.path)
    text = lineage_recipe(frame, source_hash(stacked.source), built.path)
    assert recipe.apply(recipe.parse(text)) == stacked.source
    # results.log and the report name its operators; the recipe holds their args.
    line = format_lineage(history.lineage(frame, source_hash(stacked.source)))
    assert line.startswith("seed -> stack(allele.") and "allele.moe.triton_grouped, " in line and "repairs" not in line


def test_a_program_that_lacks_levers_in_one_gene_is_swept_one_step_at_a_time():
    # A program with RoPE, SwiGLU and graphs kernels: another of each is a sideways move, the
    # sweep's to measure, and the MoE's kernel alone is one lever.
    kernels = recipe.apply(recipe.parse("allele.apply_rope.triton_rows\nallele.mlp.glu_matmul\n"
                                        "allele.Engine.cuda_graphs_prefill"), SEED)
    names = ["allele.apply_rope.triton", "allele.mlp.swiglu_triton", "allele.Engine.cuda_graphs",
             "allele.moe.triton_grouped"]
    result = stack(kernels, names, vocabulary(), "cuda", random.Random(0))
    assert isinstance(result, mutations.Declined) and "1 gene" in result.reason


def test_generation_one_on_a_gpu_begins_with_the_stack_then_sweeps_the_rest_of_its_places():
    config = SimpleNamespace(nsga2=False, device="cuda", tournament_size=3, num_elite=1, workers=1)
    toolbox = make_toolbox(config, [], lambda program: None, map, random.Random(0), idle_genes=idle_genes(MOE),
                           own_genes=own_genes(MOE))
    seed = Program(SEED)
    stand_in = Program(SEED + "\n# stacked\n", (seed.id,), STACK, {"steps": []})
    toolbox.register("stack", lambda best: stand_in if best.id == seed.id else None)
    breeding = Breeding(toolbox, scores=None, seed=seed, rng=random.Random(0), crossover_prob=0.0)
    budget = Budget(left_s=1200.0, final_s=100.0, screen_s=300.0, workers=1)  # a sweep of 4 fits
    children = breed(breeding, [seed], [], 4, 1, budget).children
    assert children[0] is stand_in and len(children) == 4
    assert {c.operator for c in children[1:]} <= {n for n in vocabulary().applicable(SEED, "cuda")}
    assert make_toolbox(SimpleNamespace(**{**vars(config), "device": "cpu"}), [], lambda program: None, map,
                        random.Random(0)).stack(seed) is None  # on a CPU, no stack


def test_a_hybrid_s_sweep_and_stack_never_take_prefill_graphs_which_cannot_serve_its_delta_net():
    # Engine.cuda_graphs_prefill raises on a model with DeltaNet layers: its child would crash,
    # and a stack that took it first would lose every lever with it.
    from mutations import alleles
    from target.hf_checkpoints import QWEN3_5_35B_A3B
    hybrid = ModelConfig.from_dict(dict(QWEN3_5_35B_A3B))
    assert all(set(a.cannot_serve) <= set(program.GENES) for a in alleles.library().values())
    graphs = "allele.Engine.cuda_graphs_prefill"
    on = {name: Vocabulary(mutations, mutations.random_mutation, mutations.crossover, idle_genes(c), own_genes(c))
          for name, c in (("moe", MOE), ("hybrid", hybrid))}
    seed = Program(SEED)
    assert graphs in open_operators(seed, on["moe"], Memo(), "cuda")
    assert graphs not in open_operators(seed, on["hybrid"], Memo(), "cuda")
    assert "allele.Engine.cuda_graphs" in open_operators(seed, on["hybrid"], Memo(), "cuda")


def test_stack_vs_recipe_names_the_genes_where_the_stack_and_a_recipe_part(stacked, tmp_path, capsys, monkeypatch):
    """tools.stack_vs_recipe with the fixture's stack (opening every operator and stacking them
    costs ~30 s): the stack's steps, the genes where its program and the recipe's differ, the program."""
    from tools import stack_vs_recipe
    monkeypatch.setattr(stack_vs_recipe, "open_operators", lambda *args: NAMES)
    monkeypatch.setattr(stack_vs_recipe, "stack", lambda *args: stacked)
    own = tmp_path / "own.txt"
    own.write_text("\n".join(stacked.args["steps"]))
    for name, path in (("hand", REPO / "mutations" / "recipes" / "qwen3_moe_by_hand.txt"), ("own", own)):
        stack_vs_recipe.main(["--shape", "qwen3_30b_a3b", "--recipe", str(path), "--out", str(tmp_path / name)])
        assert (tmp_path / name / "stack_rng0.py").read_text() == stacked.source
    hand, mine = capsys.readouterr().out.split("rng 0: ")[1:]
    steps = [step.operator for step in recipe.parse("\n".join(stacked.args["steps"]))]
    assert hand.startswith(f"{len(steps)} steps: {', '.join(steps)}\n")
    # The hand recipe's kernels that no opened operator makes; none where the recipe is the stack's own.
    assert "'attention': ('seed', 'split_kv')" in hand and "'moe'" not in hand and "'route'" not in hand
    assert mine.endswith("(stack, recipe): none\n")
