"""Kernel launch parameters and sizes as declared knobs: each parses, its range is valid and
lets `tune_constant` move it, each reaches the programs its allele makes, and programs tuned
to the ends of their ranges still pass the gate where they run on a CPU (seconds)."""
import random
import re
from pathlib import Path

import pytest

import mutations
from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from fitness.cases import call_bounds, select_cases
from fitness.gate import check_module
from mutations import program, recipe
from mutations.rewrites.tune_constant import declared, declared_values, fitted_to, tunable

MUTATIONS = Path(mutations.__file__).resolve().parent
# Any top-level assignment whose comment names a range, well formed or not.
RANGE_COMMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)\s*=.*#\s*range\b", re.MULTILINE)
SEED = program.SEED_PATH.read_text()


def knob_files() -> dict:
    """file -> the names it declares a range for, by its text."""
    found = {}
    for path in sorted(MUTATIONS.rglob("*.py")):
        names = RANGE_COMMENT.findall(path.read_text())
        if names and path.name != "tune_constant.py":
            found[path] = names
    return found


def swapped(name: str) -> str:
    result = mutations.get_operator(name).apply(SEED, random.Random(0))
    assert isinstance(result, mutations.Applied), result
    return result.source


def test_every_declared_knob_parses_and_can_move_within_its_range():
    files = knob_files()
    assert len(files) >= 10 and sum(map(len, files.values())) >= 25
    for path, names in files.items():
        module = program.parse(path.read_text())
        found = declared(module)
        assert set(names) == set(found), f"{path.name}: a range comment tune_constant cannot read"
        values, movable = declared_values(module), {name for _, name, _, _ in tunable(module)}
        for name, (_, (lo, hi)) in found.items():
            assert lo < hi and lo <= values[name] <= hi, f"{path.name}: {name} = {values[name]}, range {lo}..{hi}"
            assert name in movable, f"{path.name}: {name} can neither halve nor double inside {lo}..{hi}"


def test_a_knob_declared_twice_is_declared_alike():
    lines = {}
    for path in knob_files():
        for line in path.read_text().splitlines():
            match = RANGE_COMMENT.match(line)
            if match:
                assert lines.setdefault(match.group(1), line) == line, f"{match.group(1)} differs in {path.name}"


@pytest.mark.parametrize("swap", ["allele.Engine.cuda_graphs_prefill", "allele.mlp.swiglu_triton", "allele.mlp.glu_matmul",
                                  "allele.rms_norm.triton", "allele.add_rms_norm.triton",
                                  "allele.apply_rope.triton_rows", "allele.Engine.cuda_graphs",
                                  "allele.norm_heads.triton"])
def test_every_knob_of_an_allele_reaches_its_programs(swap):
    """Knobs declared in a helper file (graph buckets, the RoPE launch) come with the helpers."""
    source = swapped(swap)
    declared_here = set(declared_values(program.parse(source)))
    gene, allele = swap.split(".")[1:]
    own = set(RANGE_COMMENT.findall((MUTATIONS / "alleles" / gene / f"{allele}.py").read_text()))
    assert own <= declared_here
    if swap.startswith("allele.Engine"):
        assert {"GRAPH_BUCKET_STEP", "MAX_GRAPH_BATCH"} <= declared_here
    if swap.startswith("allele.apply_rope"):
        assert "ROPE_WARPS" in declared_here


def at_low_ends(source: str) -> str:
    """`source` with every declared knob at the low end of its range."""
    for name, (_, (lo, _)) in declared(program.parse(source)).items():
        result = mutations.get_operator("tune_constant").replay(source, {"constant": name, "new": lo})
        source = result.source if isinstance(result, mutations.Applied) else source
    return source


@pytest.mark.parametrize("swap", ["allele.KVCache.paged", "allele.KVCache.slab", "allele.Engine.cuda_graphs"])
def test_a_program_tuned_to_the_low_ends_of_its_ranges_passes_the_gate_on_cpu(swap, small_target, scratch, tmp_path):
    """The low ends stress what a CPU can run: pools and slabs that grow, pages of 8 tokens, a
    decode graph every 4 batch sizes (the high ends allocate gigabytes up front)."""
    source = at_low_ends(swapped(swap))
    assert source != swapped(swap)
    path = tmp_path / "tuned.py"
    path.write_text(source)
    config_path, weight_dir = small_target
    result = check_module(load_engine_module(path), ModelConfig.load(config_path), weight_dir, "cpu", 11, scratch)
    assert result.passed, (declared_values(program.parse(source)), result.error)


def test_a_constant_move_extends_the_way_it_went():
    """tune_constant's next step: a doubling doubled again, a halving halved again, no step
    out of the range or from args that record no move."""
    operator = mutations.get_operator("tune_constant")
    source = swapped("allele.KVCache.paged")
    name = "PAGE_SIZE"
    value, (lo, hi) = declared_values(program.parse(source))[name], declared(program.parse(source))[name][1]
    up = operator.replay(source, {"constant": name, "new": value * 2})
    step = operator.extend(up.source, up.args)
    assert isinstance(step, mutations.Applied), step
    assert step.args == {"constant": name, "old": value * 2, "new": value * 4}
    assert declared_values(program.parse(step.source))[name] == value * 4
    down = operator.extend(source, {"constant": name, "old": value * 2, "new": value})
    assert declared_values(program.parse(down.source))[name] == value // 2
    at_top = operator.replay(source, {"constant": name, "new": hi})
    assert isinstance(operator.extend(at_top.source, {"constant": name, "old": hi // 2, "new": hi}), mutations.Declined)
    assert isinstance(operator.extend(source, {"constant": name}), mutations.Declined)
    assert isinstance(mutations.get_operator("fuse_linears").extend(source, {}), mutations.Declined)


def test_constants_that_bound_a_call_are_fitted_to_the_largest_call_of_the_cases():
    """`fits:` constants rise to the next power of two at or above their bound, inside their
    range; none is lowered, and an untagged one is left alone."""
    assert call_bounds(select_cases("long")) == {"prefill_tokens": 8192, "prefill_prompts": 4, "decode_batch": 8}
    assert call_bounds(select_cases("public")) == {"prefill_tokens": 512, "prefill_prompts": 8, "decode_batch": 8}
    source = "\n".join([
        "TOKENS = 2048  # range: 256..16384, fits: prefill_tokens; the most packed tokens",
        "PROMPTS = 16  # range: 4..64, fits: prefill_prompts",
        "UNTAGGED = 64  # range: 8..256; the largest batch",
        "BATCH = 64  # range: 8..128, fits: decode_batch", ""])
    bounds = {"prefill_tokens": 5000, "prefill_prompts": 4, "decode_batch": 500}
    assert fitted_to(source, bounds) == [{"constant": "TOKENS", "new": 8192}, {"constant": "BATCH", "new": 128}]
    assert fitted_to(source, {"prefill_tokens": 2048}) == []
    # The recipe's program fits its captured prefill's tokens (not its prompts) and its decode graphs.
    program = recipe.apply(recipe.parse((MUTATIONS / "recipes" / "fastest.txt").read_text()))
    assert fitted_to(program, call_bounds(select_cases("public"))) == []
    assert fitted_to(program, call_bounds(select_cases("long"))) == [{"constant": "MAX_PREFILL_TOKENS", "new": 8192}]
    assert fitted_to(program, {"prefill_tokens": 16384, "prefill_prompts": 64, "decode_batch": 100}) == [
        {"constant": "MAX_GRAPH_BATCH", "new": 128}, {"constant": "MAX_PREFILL_TOKENS", "new": 16384}]
