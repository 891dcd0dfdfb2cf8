"""python -m evolve report: tables, lineage, plots; a damaged history line is skipped."""
import subprocess
import sys
from pathlib import Path

from evolve.config import RunConfig
from evolve.report import generation_table, operator_table
from evolve import history
from evolve.search import run
from tests.test_evolve_stand_in import crossover, fake_judge, random_mutation

REPO = Path(__file__).resolve().parent.parent


def make_history(small_target, tmp_path) -> Path:
    config_path, weight_dir = small_target
    config = RunConfig.build("cpu", model_config=config_path, weight_dir=weight_dir, population=4,
                             generations=3, rng_seed=11, runs_dir=tmp_path / "runs",
                             workspace=tmp_path / "ws", history=tmp_path / "history.csv")
    run(config, mutate_fn=random_mutation, mate_fn=crossover, judge_fn=fake_judge)
    return config.history


def test_report_on_a_damaged_history_warns_and_still_prints(small_target, tmp_path):
    path = make_history(small_target, tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(3, lines[3][: len(lines[3]) // 2] + "\n")  # a line cut in half
    path.write_text("".join(lines))
    out = subprocess.run([sys.executable, "-m", "evolve", "report", str(path), "--out", str(tmp_path / "plots")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "skipped a damaged line" in out.stderr and ":4:" in out.stderr
    assert "per generation" in out.stdout and "operators" in out.stdout
    assert "stand_in_comment" in out.stdout and "lineage: seed" in out.stdout
    for name in ("fitness_over_time.png", "pass_rate.png", "tps_vs_memory.png"):
        png = tmp_path / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tables_count_children_and_improvements(small_target, tmp_path):
    frame = history.read(make_history(small_target, tmp_path))
    per_generation = generation_table(frame)
    assert list(per_generation["generation"]) == [0, 1, 2, 3]
    assert per_generation["best_so_far"].is_monotonic_increasing
    operators = operator_table(frame).set_index("operator")
    judged = history.judged_rows(frame)
    assert operators.loc["stand_in_comment", "children"] == (judged["operator"] == "stand_in_comment").sum()
    if "stand_in_break" in operators.index:
        assert operators.loc["stand_in_break", "correct"] == 0
    assert (operators["improved"] <= operators["correct"]).all()
    assert "seed" in operators.index and operators.loc["seed", "improved"] == 0


def test_report_of_a_missing_history_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "evolve", "report", str(tmp_path / "none.csv")],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no history" in out.stderr
