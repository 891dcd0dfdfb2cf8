"""The evaluator-compatible commands, run as a user would."""
import json
import os
import subprocess
import sys

from fitness.adversaries import planted
from tests.conftest import REPO, SEED_ENGINE


def fitness_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fitness", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)


def target_args(small_target):
    config_path, weight_dir = small_target
    return ["--model-config", config_path, "--weight-dir", weight_dir, "--device", "cpu"]


def test_check_passes_the_seed(small_target, tmp_path):
    """...with the derived configs' weights in --scratch, and no folder of its own left."""
    scratch, tmp = tmp_path / "scratch", tmp_path / "tmp"
    scratch.mkdir(), tmp.mkdir()
    done = fitness_cli("check", "--engine", SEED_ENGINE, *target_args(small_target), "--seed", 3,
                       "--scratch", scratch, env=dict(os.environ, TMPDIR=str(tmp)))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "passed" and report["seed"] == 3
    assert {"target", "gqa", "bf16", "deeper"} <= set(report["configs"])
    assert any(scratch.iterdir()) and not [p for p in tmp.iterdir() if p.name.startswith("check_weights_")]


def test_check_fails_with_the_case_name(small_target, tmp_path):
    faulty = planted.write_faulty("stale_logits", tmp_path)
    done = fitness_cli("check", "--engine", faulty, *target_args(small_target))
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["status"] == "failed" and report["case"] == "target"
    assert "public/single_decode" in report["errors"][0]


def test_judge_prints_one_json_verdict(small_target, tmp_path):
    # The small cases: the public ones are judged in test_cheats and test_group_judging.
    done = fitness_cli("judge", SEED_ENGINE, *target_args(small_target), "--bench", "small",
                       "--rounds", 1, "--baseline", SEED_ENGINE, "--max-rounds", 2, "--scratch", tmp_path,
                       "--timeout", 200)
    verdict = json.loads(done.stdout)
    assert done.returncode == 0 and verdict["status"] == "ok", verdict["error"]
    assert set(verdict["tokens_per_second"]) == {"prefill_4x32", "decode_8x8x8", "mixed_small"}
    assert all(v > 0 for v in verdict["tokens_per_second"].values())
    assert 1 <= verdict["rounds"] <= 2 and verdict["ratio_low"] <= verdict["ratio"] <= verdict["ratio_high"]


def test_missing_weights_is_a_clear_error(small_target, tmp_path):
    config_path, _ = small_target
    done = fitness_cli("check", "--engine", SEED_ENGINE, "--model-config", config_path,
                       "--weight-dir", tmp_path / "nowhere", "--device", "cpu")
    assert done.returncode == 1 and "weights not found" in done.stdout
