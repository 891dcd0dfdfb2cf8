"""workspace/engine.py says what it is (a header naming its run, lineage, figures and
device, in place of the seed's docstring); results.log shows no roofline off a GPU."""
import ast
import re
from types import SimpleNamespace

from evolve import checkpoint
from evolve.search import run
from evolve.workspace import Roofline, Workspace, roofline_tps, with_header
from fitness.gate import static_problems
from tests.conftest import SEED_ENGINE
from tests.test_evolve_loop import STAND_INS, make_config, only_run_dir

SEED = SEED_ENGINE.read_text()
STEPS = [{"candidate_id": "s0", "operator": "seed", "operator_args": "", "parent_ids": []},
         {"candidate_id": "c1", "operator": "allele.KVCache.paged",
          "operator_args": '{"allele": "paged", "gene": "KVCache", "repairs": {}}', "parent_ids": ["s0"]},
         {"candidate_id": "c2", "operator": "crossover", "operator_args": '{"genes": {"KVCache": "a", "mlp": "b"}}',
          "parent_ids": ["c1", "b7"]}]
TABLE = [("prefill", 3000.0, 1000.0), ("decode", 500.0, 250.0)]


def docstring_and_code(source: str) -> tuple:
    tree = ast.parse(source)
    first = tree.body[0]
    return ast.get_docstring(tree, clean=False), source.splitlines()[first.end_lineno:]


def test_the_header_replaces_the_seeds_docstring_and_keeps_the_code():
    engine = with_header(SEED, "run-7", STEPS, TABLE, "cuda (NVIDIA H100 80GB HBM3)", "Winner: 2.449x the seed")
    header, code = docstring_and_code(engine)
    assert code == docstring_and_code(SEED)[1]
    assert static_problems(engine) == []
    assert header.startswith("Engine ") and "run run-7" in header and "Seed engine" not in header
    assert "Winner: 2.449x the seed." in header and "Judged on cuda (NVIDIA H100 80GB HBM3)." in header
    assert "  allele.KVCache.paged(" in header and "  crossover with b7 (its mlp)" in header
    prefill = next(line for line in header.splitlines() if line.strip().startswith("prefill"))
    assert prefill.split()[1:] == ["3,000", "1,000", "3.00"]


def test_a_header_is_added_where_there_is_no_docstring_and_survives_quotes():
    source = SEED.split('"""', 2)[2].lstrip("\n")  # the seed without its docstring
    odd = 'a""""b\\n\\'  # a run of quotes, backslashes, one at the end
    engine = with_header(source, "r", [{**STEPS[1], "operator_args": odd}], [], "cpu", "Best so far")
    header, code = docstring_and_code(engine)
    assert code == source.splitlines()
    assert f"allele.KVCache.paged({odd})" in header  # exactly as recorded
    assert "No tokens/s against the seed" in header


def test_a_run_leaves_an_engine_headed_by_its_run_and_a_log_without_a_cpu_roofline(small_target, tmp_path):
    config = make_config(small_target, tmp_path)
    assert run(config, **STAND_INS) == 0
    run_id = checkpoint.load(only_run_dir(config))["run_id"]
    header, _ = docstring_and_code((config.workspace / "engine.py").read_text())
    assert f"run {run_id}" in header and "x the seed" in header and "Judged on cpu (" in header
    assert "Lineage, from seed_engine/engine.py:\n  seed\n" in header and "seed tok/s" in header
    log = (config.workspace / "results.log").read_text()
    assert "roofline: none for a cpu run: the speed-of-light model is for GPUs" in log
    assert "h100" not in log and "of roofline" not in log


def test_mid_run_the_engine_is_the_best_so_far(small_target, tmp_path):
    config = make_config(small_target, tmp_path, generations=3)
    calls = []

    def judge_then_interrupt(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:  # the first child: generation 0 has kept its best (the seed)
            raise KeyboardInterrupt
        return STAND_INS["judge_fn"](path, *args, **kwargs)

    assert run(config, **{**STAND_INS, "judge_fn": judge_then_interrupt}) == 130
    header, _ = docstring_and_code((config.workspace / "engine.py").read_text())
    assert re.search(r"^Best so far after generation 0: [\d,]+ tokens/s", header, re.MULTILINE), header
    assert "Winner" not in header and "Judged on cpu." in header


def test_roofline_of_a_cpu_run_is_none_and_results_log_says_why(tmp_path):
    bounds = roofline_tps(SimpleNamespace(device="cpu"))
    assert bounds.bounds == {} and "for GPUs" in bounds.missing
    workspace = Workspace(tmp_path)
    workspace.log_final("w1", TABLE, STEPS, 2.4, "re-measured", bounds)
    log = (tmp_path / "results.log").read_text()
    assert "roofline: none for a cpu run" in log and "roofline tok/s" not in log
    workspace.log_final("w1", TABLE, STEPS, 2.4, "re-measured", Roofline({"prefill": 2000.0}, "h200"))
    log = (tmp_path / "results.log").read_text()
    assert "roofline tok/s (h200)" in log and "ABOVE THE SPEED OF LIGHT" in log  # 3,000 > 2,000
