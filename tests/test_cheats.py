"""Cheats planted in the candidate: each is rejected, or timed at its real speed.

The judge keeps the clock, the comparison and the reference in its own process, and
compares rows of every timed run's outputs (picked after the run) with the reference on
fresh tokens; the candidate runs in a runner process (fitness.runner), where what it
patches changes nothing that decides its verdict. The weight files it can write are held
to what they were (fitness.weight_files).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from fitness.gate import static_problems
from fitness.sandbox import JudgeProcess, judge
from fitness.weight_files import fingerprint
from tests import cheats
from tests.conftest import REPO, SEED_ENGINE


def judged_beside_the_seed(path, small_target, scratch):
    config_path, weight_dir = small_target
    return judge(path, config_path, weight_dir, "cpu", timeout=240, scratch=str(scratch), threads=1,
                 level="screen", bench="public", baseline=SEED_ENGINE, min_rounds=2, max_rounds=3)


@pytest.mark.parametrize("name", ["slow_clock", "caches_by_input"])
def test_a_cheat_on_the_clock_or_on_repeated_inputs_is_timed_at_its_real_speed(name, small_target, scratch, tmp_path):
    verdict = judged_beside_the_seed(cheats.write_cheat(name, tmp_path), small_target, scratch)
    assert verdict["status"] == "ok", verdict["error"]
    # The same work as the seed: in-process timing would have seen ~10x (the clock) or a
    # prefill answered from memory (the cache); the judge's clock and fresh tokens see ~1x.
    assert verdict["ratio"] < 2.0, verdict


@pytest.mark.parametrize("name, stage", [("forged_comparison", "target"), ("lazy_when_timed", "timed"),
                                         ("replays_earlier_outputs", "timed")])
def test_a_cheat_on_the_comparison_or_on_timed_calls_is_incorrect(name, stage, small_target, scratch, tmp_path):
    verdict = judged_beside_the_seed(cheats.write_cheat(name, tmp_path), small_target, scratch)
    assert verdict["status"] == "incorrect", verdict
    assert verdict["stage"] == stage and "tolerance" in verdict["error"], verdict


def test_a_cheat_that_answers_before_its_outputs_exist_is_incorrect(small_target, scratch, tmp_path):
    """Its `go` answers before any call ran: the checksum it answers is not that of the
    outputs it sends later."""
    verdict = judged_beside_the_seed(cheats.write_cheat("answers_before_its_outputs", tmp_path), small_target, scratch)
    assert verdict["status"] == "incorrect", verdict
    assert "not those the timed run answered for" in verdict["error"], verdict


def test_a_cheat_that_rewrites_the_weights_fails_and_so_does_every_judgement_after(small_target, tmp_path):
    """A reference loaded from a rewritten file would be the cheat's own model: a zeroing
    engine judged ok at 500x the seed by the next judge process. The search's fingerprint of
    the target, taken before any candidate ran, holds every later judge to the original."""
    config_path, weight_dir = small_target
    own = tmp_path / "weights"  # the cheat destroys the file it is given
    shutil.copytree(weight_dir, own)
    before = fingerprint(own)
    cheat = cheats.write_cheat("rewrites_the_weights", tmp_path)
    verdicts = []
    for path in (cheat, cheat, SEED_ENGINE):  # each in a judge process of its own
        judge_process = JudgeProcess("cpu", scratch=tmp_path / "scratch")
        try:
            verdicts.append(judge_process.judge(path, config_path, own, timeout=120, level="screen", bench="none",
                                                weights_fingerprint=before))
        finally:
            judge_process.stop()
    assert [(v["status"], v["stage"]) for v in verdicts] == [("invalid", "weights")] * 3, verdicts
    assert all(v["weights_changed"] and "changed on disk" in v["error"] for v in verdicts)


def test_every_cheat_passes_the_static_stage():
    for name in cheats.CHEATS:
        assert static_problems(getattr(cheats, name)(SEED_ENGINE.read_text())) == [], name


def test_the_clock_cheat_fools_a_judge_that_times_in_the_candidates_process(small_target, tmp_path):
    """Why the clock is the judge's: the contract's in-process protocol (fitness bench, as
    the public evaluator times) sees the clock cheat as several times faster than the seed."""
    config_path, weight_dir = small_target

    def bench(engine):
        done = subprocess.run([sys.executable, "-m", "fitness", "bench", "--engine", str(engine), "--model-config",
                               str(config_path), "--weight-dir", str(weight_dir), "--device", "cpu", "--cases",
                               "public"], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr
        return {r["case_name"]: r["tokens_per_second"] for r in json.loads(done.stdout)}

    fooled, honest = bench(cheats.write_cheat("slow_clock", tmp_path)), bench(SEED_ENGINE)
    assert all(fooled[case] > 4 * honest[case] for case in honest), (fooled, honest)
