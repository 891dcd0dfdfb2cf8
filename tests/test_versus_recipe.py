"""tools.versus_recipe: per-case ratios over rounds, their interval, and when they decide."""
import json

import pytest

from tools import versus_recipe


def test_a_ratio_is_decided_when_its_interval_excludes_1_or_is_within_2_percent():
    assert versus_recipe.decided([1.50, 1.60, 1.55])  # clearly faster
    assert versus_recipe.decided([0.70, 0.72, 0.69])  # clearly slower
    assert versus_recipe.decided([1.000, 1.004, 0.997])  # the same, to within +-2%
    assert not versus_recipe.decided([0.90, 1.10, 1.00])  # spread over 1
    assert not versus_recipe.decided([1.30])  # one round: no spread to judge by
    low, high = versus_recipe.interval([1.50, 1.60, 1.55])
    assert low < 1.55 < high


def write_round(folder, round_, engine, tokens_per_s):
    results = [{"case_name": case, "tokens_per_second": tps} for case, tps in tokens_per_s.items()]
    (folder / f"{round_}.{engine}.json").write_text(json.dumps(results))


def test_decided_exits_1_while_a_case_is_undecided(tmp_path, capsys):
    for round_, (decode, prefill) in enumerate([(200, 90), (210, 110), (205, 100)], start=1):
        write_round(tmp_path, round_, "winner", {"decode": decode, "prefill": prefill})
        write_round(tmp_path, round_, "recipe", {"decode": 100, "prefill": 100})
    with pytest.raises(SystemExit) as ended:
        versus_recipe.main([str(tmp_path), "--decided"])
    assert ended.value.code == 1
    out = capsys.readouterr().out
    assert "prefill" in out and "(undecided)" in out.split("prefill")[1].splitlines()[0]
    assert "(undecided)" not in out.split("decode")[1].splitlines()[0]
    write_round(tmp_path, 1, "winner", {"decode": 200, "prefill": 200})  # prefill now 2.0 / 1.1 / 1.0: still open
    with pytest.raises(SystemExit):
        versus_recipe.main([str(tmp_path), "--decided"])
    for round_ in (1, 2, 3):
        write_round(tmp_path, round_, "winner", {"decode": 200, "prefill": 150 + round_})
    versus_recipe.main([str(tmp_path), "--decided"])  # every case decided: returns


def test_a_round_where_a_run_failed_is_left_out_and_said(tmp_path, capsys):
    """bench_rounds leaves an empty result where `fitness bench` failed; the other rounds
    still give the ratio."""
    for round_ in (1, 2):
        write_round(tmp_path, round_, "winner", {"decode": 200})
        write_round(tmp_path, round_, "recipe", {"decode": 100})
    write_round(tmp_path, 3, "winner", {"decode": 200})
    (tmp_path / "3.recipe.json").write_text("")
    assert versus_recipe.ratios(tmp_path, "winner", "recipe") == {"decode": [2.0, 2.0]}
    assert "3: left out, a run failed" in capsys.readouterr().err
