"""Recipes: replaying operators as recorded, `python -m mutations recipe`, the fastest
recipe, and a winner's lineage written by `python -m evolve report --recipe` (CPU, seconds)."""
import json
import random
import subprocess
import sys

import pytest

import mutations
from contract.loader import source_hash
from evolve import history
from evolve.recipe import LineageError, lineage_recipe
from evolve.report import report
from fitness.gate import static_problems
from mutations import program, recipe
from tests.conftest import FASTEST, REPO, SEED_ENGINE

SEED = SEED_ENGINE.read_text()
RNG_OPERATORS = tuple(op.name for op in mutations.all_operators() if op.draws)
# Besides those, operators that draw nothing: one swap that repairs, one that does not, a rewrite.
DETERMINISTIC = ("allele.load_weights.fused_both", "allele.KVCache.slab", "last_token_logits")


def applied(name, source, seed=0):
    result = mutations.get_operator(name).apply(source, random.Random(seed))
    assert isinstance(result, mutations.Applied), result
    return result


def run_module(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


PAGED = applied("allele.KVCache.paged", SEED).source  # declares PAGE_SIZE and POOL_PAGES


# --- replay ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", RNG_OPERATORS + DETERMINISTIC)
def test_replaying_what_an_operator_recorded_makes_the_same_child(name):
    needs = mutations.get_operator(name).needs_swap
    for source in (SEED, PAGED) + ((applied(needs, SEED).source,) if needs else ()):
        for seed in range(4 if name in RNG_OPERATORS else 1):
            result = mutations.get_operator(name).apply(source, random.Random(seed))
            if isinstance(result, mutations.Declined):
                continue
            recorded = json.loads(json.dumps(result.args))  # as history.csv holds them
            again = mutations.get_operator(name).replay(source, recorded)
            assert isinstance(again, mutations.Applied), again
            assert again.source == result.source and again.args == result.args


def test_tune_constant_replays_the_recorded_constant_not_a_random_one():
    result = mutations.get_operator("tune_constant").replay(PAGED, {"constant": "PAGE_SIZE", "old": 16, "new": 32})
    assert "PAGE_SIZE = 32  # range: 8..256" in result.source
    assert [line for line in result.source.splitlines() if line.startswith("POOL_PAGES")] == \
           [line for line in PAGED.splitlines() if line.startswith("POOL_PAGES")]
    assert result.args == {"constant": "PAGE_SIZE", "old": 16, "new": 32}
    # Any value inside the range (what a crossover took from another parent), nothing outside it.
    assert "PAGE_SIZE = 128" in mutations.get_operator("tune_constant").replay(
        PAGED, {"constant": "PAGE_SIZE", "new": 128}).source


@pytest.mark.parametrize("args, reason", [
    ({"constant": "PAGE_SIZE", "old": 8, "new": 32}, "recorded old=8, this program gives old=16"),
    ({"constant": "PAGE_SIZE", "new": 512}, "outside its range 8..256"),
    ({"constant": "SLAB_SLOTS", "new": 8}, "declares no tunable constant 'SLAB_SLOTS'"),
    ({"constant": "PAGE_SIZE", "new": 16}, "changed nothing"),
])
def test_tune_constant_declines_a_choice_it_cannot_make(args, reason):
    result = mutations.get_operator("tune_constant").replay(PAGED, args)
    assert isinstance(result, mutations.Declined) and reason in result.reason


def test_replays_decline_choices_the_program_does_not_offer():
    assert "no group of matmuls matches" in mutations.get_operator("fuse_linears").replay(
        SEED, {"function": "mlp", "input": "x", "weights": "layer", "keys": ["up", "gate"]}).reason
    assert "no compilable gene" in mutations.get_operator("torch_compile").replay(
        SEED, {"gene": "Engine", "mode": "default", "dynamic": None}).reason
    assert "no per-call table building" in mutations.get_operator("hoist_tables").replay(
        SEED, {"class": "KVCache", "gene": "rope_tables"}).reason
    swap = mutations.get_operator("allele.load_weights.fused_qkv")
    assert 'recorded repairs={}' in swap.replay(SEED, {"gene": "load_weights", "repairs": {}}).reason


# --- the recipe file and its command ----------------------------------------------------------

def test_parse_reads_names_args_and_comments():
    steps = recipe.parse('# a comment\n\nlast_token_logits\n'
                         'tune_constant {"constant": "PAGE_SIZE", "new": 32}  # doubled\n')
    assert [(s.operator, s.args, s.line_no) for s in steps] == [
        ("last_token_logits", {}, 3), ("tune_constant", {"constant": "PAGE_SIZE", "new": 32}, 4)]
    for bad in ('tune_constant {"constant": ', "tune_constant PAGE_SIZE", "tune_constant [1]"):
        with pytest.raises(recipe.RecipeError, match="line 1"):
            recipe.parse(bad)


def test_recipe_command_writes_the_program_and_checks_its_hash(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text('allele.KVCache.paged\ntune_constant {"constant": "PAGE_SIZE", "old": 16, "new": 32}\n')
    expected = mutations.get_operator("tune_constant").replay(PAGED, {"constant": "PAGE_SIZE", "new": 32}).source
    out = run_module("mutations", "recipe", path, "-o", tmp_path / "e.py", "--check-hash", source_hash(expected))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "e.py").read_text() == expected
    wrong = run_module("mutations", "recipe", path, "-o", tmp_path / "f.py", "--check-hash", "0" * 16)
    assert wrong.returncode == 1 and f"makes {source_hash(expected)}, not {'0' * 16}" in wrong.stderr
    assert not (tmp_path / "f.py").exists()


@pytest.mark.parametrize("line, reason", [
    ('tune_constant {"constant": "PAGE_SIZE", "old": 8, "new": 32}', "recorded old=8"),
    ("allele.KVCache.paged", "KVCache already carries paged"),
    ("no_such_operator", "no operator named 'no_such_operator'"),
    ('crossover {"genes": {}}', "a recipe is linear"),
])
def test_a_line_that_declines_is_an_error_naming_it(tmp_path, line, reason):
    path = tmp_path / "r.txt"
    path.write_text(f"# two good lines, then a bad one\nallele.KVCache.paged\nlast_token_logits\n{line}\n")
    out = run_module("mutations", "recipe", path, "-o", tmp_path / "e.py")
    assert out.returncode == 1
    assert f"line 4: {line.split()[0]} declined: " in out.stderr and reason in out.stderr
    assert not (tmp_path / "e.py").exists()


def test_the_fastest_recipe_applies_on_cpu_and_keeps_every_allele(fastest_source):
    steps, source = recipe.parse(FASTEST.read_text()), fastest_source
    assert static_problems(source) == []
    carried = program.gene_alleles(program.parse(source))
    swaps = [s.operator.split(".")[1:] for s in steps if s.operator.startswith("allele.")]
    assert len(swaps) == 13 and all(carried[gene] == allele for gene, allele in swaps)
    assert [s.operator for s in steps[-2:]] == ["last_token_logits", "prefetched_linears"]
    for rewrite in ("last_token_logits", "prefetched_linears", "programmatic_launch"):  # each already done
        assert isinstance(mutations.get_operator(rewrite).apply(source, random.Random(0)), mutations.Declined)


# --- a winner's lineage as a recipe ------------------------------------------------------------

class HistoryBuilder:
    """history.csv rows of programs made by hand, their sources where the search keeps them."""

    def __init__(self, tmp_path):
        self.path, self.dir = tmp_path / "history.csv", tmp_path / "candidates"
        self.dir.mkdir()
        self.history = history.History(self.path)
        self.add(SEED, (), "seed", {}, fitness=1.0)

    def add(self, source, parents, operator, args, fitness):
        candidate_id = source_hash(source)
        path = self.dir / f"{candidate_id}.py"
        path.write_text(source)
        self.history.append({"run_id": "r1", "generation": 1, "candidate_id": candidate_id,
                             "parent_ids": [source_hash(p) for p in parents], "operator": operator,
                             "operator_args": args, "status": "ok", "fitness": fitness, "device": "cpu",
                             "source_path": str(path), "target": "t"})
        return source

    def child(self, parent, name, fitness, seed=0):
        result = applied(name, parent, seed)
        return self.add(result.source, (parent,), result.operator, result.args, fitness)

    def cross(self, a, b, seed, fitness):
        result = mutations.crossover(a, b, random.Random(seed))
        assert isinstance(result, mutations.Applied), result
        return self.add(result.source, (a, b), result.operator, result.args, fitness)


def test_report_recipe_reproduces_a_winner_made_with_a_crossover_and_a_tuned_constant(tmp_path):
    built = HistoryBuilder(tmp_path)
    tuned = built.child(built.child(SEED, "allele.KVCache.paged", 1.1), "tune_constant", 1.2)
    fused_qkv = built.child(SEED, "allele.load_weights.fused_qkv", 1.1)
    other = built.child(fused_qkv, "allele.attend_prefill.sdpa_per_request", 1.3)
    seed = crossover_seed(tuned, other, KVCache="a", load_weights="b", attend_prefill="b")
    crossed = built.cross(tuned, other, seed=seed, fitness=1.5)
    winner = built.child(crossed, "last_token_logits", 2.0)
    out = run_module("evolve", "report", built.path, "--out", tmp_path / "plots", "--recipe", tmp_path / "w.txt")
    assert out.returncode == 0, out.stdout + out.stderr
    text = (tmp_path / "w.txt").read_text()
    assert "# crossover" in text and "tune_constant" in text and "allele.load_weights.fused_qkv" in text
    made = run_module("mutations", "recipe", tmp_path / "w.txt", "-o", tmp_path / "w.py", "--check-hash",
                      source_hash(winner))
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "w.py").read_text() == winner


def crossover_seed(a, b, **origins) -> int:
    """An rng seed for which crossover(a, b) takes each named gene from the parent given."""
    for seed in range(100):
        result = mutations.crossover(a, b, random.Random(seed))
        if isinstance(result, mutations.Applied) and all(result.args["genes"][g] == p for g, p in origins.items()):
            return seed
    raise AssertionError(f"no crossover seed under 100 takes {origins}")


def test_a_crossover_of_a_rewritten_gene_is_written_with_the_rewrite_the_history_recorded(tmp_path):
    built = HistoryBuilder(tmp_path)
    paged = built.child(SEED, "allele.KVCache.paged", 1.1)
    fused = built.add(mutations.get_operator("fuse_linears").replay(SEED, {"function": "mlp"}).source, (SEED,),
                      "fuse_linears", {"function": "mlp"}, 1.2)  # a rewritten mlp: still the seed allele
    crossed = built.cross(paged, fused, seed=crossover_seed(paged, fused, mlp="b", KVCache="a"), fitness=1.5)
    assert "differs from the child" in recipe.crossover_steps(paged, crossed)  # swaps alone cannot
    text = lineage_recipe(history.read(built.path), source_hash(crossed), built.path)
    assert 'fuse_linears {"function": "mlp"' in text.split("as swaps:")[1]
    assert recipe.apply(recipe.parse(text)) == crossed


def test_a_merge_of_every_gain_that_took_last_token_logits_is_written_with_it(tmp_path):
    # An H100 search's winner (merge_every_gain of a last_token_logits gain into a best whose
    # Engine was a graphs allele) had no recipe: swaps gave the Engine its allele's plain code.
    built = HistoryBuilder(tmp_path)
    graphs = built.child(SEED, "allele.Engine.cuda_graphs", 1.5)
    logits = built.child(graphs, "last_token_logits", 1.6)
    best = built.child(graphs, "allele.add_rms_norm.triton", 1.7)
    merged = mutations.merge_gains(best, logits, graphs, random.Random(0), {"Engine"})
    assert isinstance(merged, mutations.Applied), merged
    built.add(merged.source, (best, logits), "merge_every_gain", {}, 2.0)
    text = lineage_recipe(history.read(built.path), source_hash(merged.source), built.path)
    assert "last_token_logits" in text.split("as swaps:")[1]
    assert recipe.apply(recipe.parse(text)) == merged.source


def test_a_merge_that_took_two_rewrites_of_one_gene_is_written_with_both(tmp_path):
    # A seed-only H100 search re-made fastest.txt's program by merge_every_gain, whose Engine
    # took last_token_logits and then prefetched_linears: each alone leaves the Engine unlike
    # the child's, and a rewrite taken only when fewer genes differed wrote no recipe (its
    # winner stayed out of the library).
    built = HistoryBuilder(tmp_path)
    graphs = built.child(SEED, "allele.Engine.cuda_graphs_prefill", 1.5)
    built.child(graphs, "last_token_logits", 1.6)
    prefetched = built.child(graphs, "prefetched_linears", 1.6)  # its recorded sites lack x[last]
    both = recipe.apply([recipe.RecipeStep("last_token_logits", {}), recipe.RecipeStep("prefetched_linears", {})], graphs)
    built.add(both, (graphs, prefetched), "merge_every_gain", {}, 2.0)
    text = lineage_recipe(history.read(built.path), source_hash(both), built.path)
    assert recipe.apply(recipe.parse(text)) == both


def test_a_merge_of_a_program_under_programmatic_launch_is_written_with_it(tmp_path):
    # An H100 search's winner took programmatic_launch's genes into a best with another
    # Triton kernel (put under PDL as the merge finished): the rewrite's recorded kernels
    # were its parent's, which the best's program does not match, so no recipe was written.
    built = HistoryBuilder(tmp_path)
    graphs = built.child(SEED, "allele.Engine.cuda_graphs_prefill", 1.5)
    pdl = built.child(graphs, "programmatic_launch", 1.6)
    best = built.child(graphs, "allele.rms_norm.triton", 1.7)
    merged = mutations.merge_gains(best, pdl, graphs, random.Random(0), {"Engine", "attend_prefill"})
    assert isinstance(merged, mutations.Applied), merged
    assert "rms_norm_kernel[(rows.shape[0],)]" in merged.source and merged.source.count("launch_pdl=PDL_LAUNCH") >= 3
    built.add(merged.source, (best, pdl), "merge_every_gain", {}, 2.0)
    text = lineage_recipe(history.read(built.path), source_hash(merged.source), built.path)
    assert "programmatic_launch" in text.split("as swaps:")[1]
    assert recipe.apply(recipe.parse(text)) == merged.source


def test_a_crossover_nothing_recorded_can_make_is_said_so(tmp_path, capsys):
    built = HistoryBuilder(tmp_path)
    paged = built.child(SEED, "allele.KVCache.paged", 1.1)
    edited = built.add(mutations.get_operator("fuse_linears").replay(SEED, {"function": "mlp"}).source, (SEED,),
                       "by_hand", {}, 1.2)  # no operator the history recorded makes this mlp
    crossed = built.cross(paged, edited, seed=crossover_seed(paged, edited, mlp="b", KVCache="a"), fitness=1.5)
    with pytest.raises(LineageError, match=f"the crossover that made {source_hash(crossed)} cannot be written"):
        lineage_recipe(history.read(built.path), source_hash(crossed), built.path)
    assert report(built.path, tmp_path / "plots", tmp_path / "w.txt") == 1
    assert "no recipe for" in capsys.readouterr().out and not (tmp_path / "w.txt").exists()


@pytest.mark.parametrize("first, second", [
    ("allele.Engine.cuda_graphs", "allele.KVCache.paged_chunks"),
    ("allele.Engine.cuda_graphs", "allele.attend_prefill.sdpa_per_request"),
])
def test_swaps_made_in_either_order_write_the_same_program(first, second):
    # Helpers used to stay where the first operator put them: 25 of 207 pairs of single
    # swaps of the seed wrote one engine as two sources in the two orders, and an H100
    # search's winner (two merges deep) had no recipe.
    one_way = applied(second, applied(first, SEED).source).source
    other_way = applied(first, applied(second, SEED).source).source
    assert program.gene_alleles(program.parse(one_way)) == program.gene_alleles(program.parse(other_way))
    assert one_way == other_way


def test_a_merge_that_takes_a_gene_away_and_back_is_the_program_it_started_from():
    best = applied("allele.Engine.cuda_graphs_prefill", SEED).source
    other = applied("allele.Engine.cuda_graphs", SEED).source
    away = mutations.merge_gains(best, other, SEED, random.Random(0), {"Engine"})
    back = mutations.merge_gains(away.source, best, SEED, random.Random(0), {"Engine"})
    assert isinstance(back, mutations.Declined) and "copy of parent b" in back.reason


def test_the_seed_is_written_as_operators_write_programs():
    assert program.finish(program.parse(SEED), [program.seed_module()]) == SEED


def test_crossovers_whose_parents_added_imports_in_other_orders_are_written_as_swaps():
    # Before imports were ordered, 19 of the crossovers between single swaps of the seed could
    # not be written (the child had `import triton.language as tl` before `import triton`),
    # among them an H100 search's winner.
    a, b = applied("allele.load_weights.fused_both", SEED).source, applied("allele.KVCache.paged_chunks", SEED).source
    children = [mutations.crossover(a, b, random.Random(seed)) for seed in range(6)]
    children = [c.source for c in children if isinstance(c, mutations.Applied) and c.source not in (a, b)]
    assert children
    for child in children:
        steps = recipe.crossover_steps(a, child)
        assert not isinstance(steps, str), steps
        assert recipe.apply(steps, a) == child
