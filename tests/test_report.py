"""python -m evolve report: tables, lineage, plots that say what they show; a damaged history
line is skipped. (--recipe: tests/test_recipes.py.)"""
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pandas as pd

from evolve import history
from evolve.config import RunConfig
from evolve.final import FINAL
from evolve.report import (ancestry, floor_of, generation_table, operator_table, plot_fitness, plot_pass_rate,
                           plot_tps_vs_memory, report, winner_of)
from evolve.scores import Scores
from evolve.search import run
from tests import test_evolve_stand_in as stand_in
from tests.conftest import SEED_ENGINE
from tests.test_evolve_stand_in import crossover, fake_judge, random_mutation

REPO = Path(__file__).resolve().parent.parent


def make_history(small_target, tmp_path) -> Path:
    config_path, weight_dir = small_target
    config = RunConfig.build("cpu", model_config=config_path, weight_dir=weight_dir, population=4,
                             generations=3, rng_seed=11, runs_dir=tmp_path / "runs",
                             workspace=tmp_path / "ws", history=tmp_path / "history.csv")
    seed, drawn = SEED_ENGINE.read_text(), stand_in.stand_in_speed
    # The seed at the floor of the stand-in's speeds, so that children beat it and the run
    # ends in a final whatever the seed's hash would draw (1,861 of 1,000-1,996 once).
    with mock.patch.object(stand_in, "stand_in_speed",
                           lambda path: 1000.0 if Path(path).read_text() == seed else drawn(path)):
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


def test_the_winner_is_the_searchs_choice_not_a_lucky_screen(small_target, tmp_path):
    frame = history.read(make_history(small_target, tmp_path))
    winner = winner_of(frame)
    assert winner and Scores.from_frame(frame).is_confirmed(winner)
    lucky = frame[frame["candidate_id"] == winner].iloc[[0]].copy()
    lucky[["candidate_id", "level", "fitness", "baseline_id"]] = ["lucky", "screen", 1e9, ""]
    assert winner_of(pd.concat([frame, lucky])) == winner  # one screen's figure, never confirmed


def test_the_winner_is_the_finals_choice_whatever_rows_follow(small_target, tmp_path):
    # A CPU run's final judged its winner 1.061x the seed, and that row tipped the fit over
    # the whole history to the winner's parent (391.0 against 390.5 tok/s): the report named,
    # and wrote the recipe of, a program the run had not returned.
    frame = history.read(make_history(small_target, tmp_path))
    final = frame[frame["operator"] == FINAL].iloc[-1]
    other = frame.loc[(frame["operator"] == "confirm") & (frame["candidate_id"] != final["candidate_id"]),
                      "candidate_id"].iloc[-1]
    # Rows far ahead, enough of them to tip the fit whatever else the (stand-in) run drew.
    tipping = frame[frame["operator"] == "confirm"].iloc[[-1] * 5].copy()
    tipping[["candidate_id", "baseline_id", "ratio", "fitness"]] = [other, final["candidate_id"], 3.0,
                                                                    3.0 * final["fitness"]]
    tipped = pd.concat([frame, tipping], ignore_index=True)
    assert Scores.from_frame(tipped).speed(other) > Scores.from_frame(tipped).speed(final["candidate_id"])
    assert winner_of(tipped) == final["candidate_id"]
    lost = tipped.copy()
    lost.loc[lost["operator"] == FINAL, "ratio"] = 0.9  # no contender beat the seed: the seed stands
    assert winner_of(lost) == final["baseline_id"]


def test_the_closing_merge_can_be_the_winner(small_target, tmp_path):
    # An H100 run's closing merge (its first row, so named by the operator that made it) won
    # the final; the report named the recipe's program and wrote the recipe of that one.
    frame = history.read(make_history(small_target, tmp_path))
    final = frame[frame["operator"] == FINAL].iloc[-1]
    closing = frame[frame["operator"] == FINAL].iloc[[-1]].copy()
    closing[["candidate_id", "operator", "parent_ids", "ratio", "fitness"]] = [
        "closing", "merge_every_gain", final["candidate_id"], 2.0 * final["ratio"], 2.0 * final["fitness"]]
    assert winner_of(pd.concat([frame, closing], ignore_index=True)) == "closing"
    screened = closing.assign(level="screen")  # a merge screened in a generation is no contender
    assert winner_of(pd.concat([frame, screened], ignore_index=True)) == winner_of(frame)


def test_report_of_a_missing_history_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "evolve", "report", str(tmp_path / "none.csv")],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no history" in out.stderr


def test_a_memory_plot_with_nothing_measured_says_so_instead_of_drawing_zeros(small_target, tmp_path):
    judged = history.judged_rows(history.read(make_history(small_target, tmp_path)))
    ok = judged[judged["status"] == "ok"]
    empty = plot_tps_vs_memory(ok.assign(peak_memory_mb=float("nan"))).axes[0]  # as a CPU judgement leaves it
    assert [text.get_text() for text in empty.texts] == ["no peak memory measured on cpu runs"]
    assert not empty.collections
    drawn = plot_tps_vs_memory(ok).axes[0]
    assert not drawn.texts and len(drawn.collections[0].get_offsets()) == (ok["peak_memory_mb"] > 0).sum()


def test_the_generation_axis_has_whole_generations_only(small_target, tmp_path):
    per_generation = generation_table(history.read(make_history(small_target, tmp_path)))
    step = range(len(per_generation))
    for figure in (plot_fitness(per_generation, step), plot_pass_rate(per_generation, step)):
        ticks = [t for t in figure.axes[0].get_xticks() if 0 <= t <= step[-1]]
        assert len(ticks) == len(step) and all(float(t).is_integer() for t in ticks)


HISTORIES = REPO / "tests" / "histories"


def test_the_report_reads_every_history_layout_the_tool_has_written(tmp_path, capsys):
    """Users read histories across versions (evolve/history.py's table of schema versions).
    tests/histories/vN.csv: version N's header, as that version wrote it (its COLUMNS at the
    commit that made it, from git), over the rows of one CPU run of today's tool; version 8,
    today's, is written here. Each reads with every column of today's (a 2026-11-22 history
    once raised KeyError), its version told, and the report prints its winner and draws the
    lineage."""
    today = tmp_path / "v8.csv"
    rows = history.read(HISTORIES / "v7.csv")
    writer = history.History(today)
    for row in rows.to_dict("records"):
        writer.append({k: ("" if isinstance(v, float) and v != v else v) for k, v in row.items()})
    winners = set()
    for version, path in enumerate(sorted(HISTORIES.glob("v*.csv")) + [today], start=1):
        frame = history.read(path)
        assert set(history.COLUMNS) <= set(frame.columns) and (frame["schema_version"] == version).all(), path
        assert report(path, tmp_path / f"report{version}") == 0
        printed = capsys.readouterr().out
        winner = printed.split("\nwinner ")[1].split()[0]
        assert (tmp_path / f"report{version}" / "lineage.png").stat().st_size > 0
        winners.add((version >= 3, winner))
    # From version 3 on the final's rows name its baseline, and the winner is the final's
    # choice; before, the best fitted confirmed program.
    assert len({w for later, w in winners if later}) == 1


def test_without_a_final_the_report_keeps_the_floor_as_the_search_does():
    """An H200 run of 5 minutes (its history as it wrote it) had no time for its final; its
    library program fitted above the floor from a screen but 0.985x it in full. The run
    returned that program then; the search and the report now keep the floor."""
    frame = history.read(HISTORIES / "h200_5_minute_run_out_of_budget.csv")
    assert (frame["operator"] != FINAL).all() and floor_of(frame) == "894876c736604502"
    scores = Scores.from_frame(frame)
    assert scores.speed("372e5190cfc277d4") > scores.speed("894876c736604502")
    assert winner_of(frame) == "894876c736604502"


def test_the_lineage_tree_places_each_program_after_all_its_parents():
    found = {"seed": ([], "seed", ""), "a": (["seed"], "allele.mlp.fused", ""), "b": (["seed"], "hoist", ""),
             "m": (["a", "b"], "merge_gains", ""), "w": (["m"], "tune_constant", ""), "other": (["seed"], "x", "")}
    assert ancestry(found, "w") == {"w": 3, "m": 2, "a": 1, "b": 1, "seed": 0}
