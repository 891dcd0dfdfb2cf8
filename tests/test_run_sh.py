"""bash run.sh end to end on CPU with a short budget, pointed at the small target."""
import os
import subprocess
import time
from pathlib import Path

from fitness.sandbox import judge

REPO = Path(__file__).resolve().parent.parent


def test_run_sh_with_a_short_budget_leaves_a_correct_engine(small_target, tmp_path):
    config_path, weight_dir = small_target
    env = {**os.environ, "EVOLVE_MODEL_CONFIG": str(config_path), "EVOLVE_WEIGHT_DIR": str(weight_dir),
           "EVOLVE_WORKSPACE": str(tmp_path / "ws"), "EVOLVE_HISTORY": str(tmp_path / "history.csv"),
           "EVOLVE_RUNS_DIR": str(tmp_path / "runs"), "EVOLVE_BUDGET": "10m", "CUDA_VISIBLE_DEVICES": ""}
    started = time.monotonic()
    out = subprocess.run(["bash", "run.sh", "--budget", "30s"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=400)
    elapsed = time.monotonic() - started
    assert out.returncode == 0, out.stdout + out.stderr
    assert "installing" not in out.stderr  # everything is there: nothing gets pulled
    assert "gen   0" in out.stdout and "left" in out.stdout
    log = (tmp_path / "ws" / "results.log").read_text()
    assert "budget_s=30.0" in log and "device=cpu" in log  # --budget beats EVOLVE_BUDGET
    assert "winner" in log and "lineage:" in log
    assert elapsed < 240, f"run.sh took {elapsed:.0f} s on a 30 s budget"
    verdict = judge(tmp_path / "ws" / "engine.py", config_path, weight_dir, "cpu", timeout=300,
                    scratch=str(tmp_path / "scratch"), threads=1, level="full", bench="none")
    assert verdict["status"] == "ok", verdict


def test_run_sh_model_points_the_search_at_a_hugging_face_directory(tmp_path):
    """--model DIR becomes the config and weights the search is given, over the environment's;
    every other flag goes through. (A stand-in python records the call: no search runs.)"""
    calls = tmp_path / "calls"
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    stand_in.chmod(0o755)
    env = {**os.environ, "PYTHON": str(stand_in), "EVOLVE_MODEL_CONFIG": "elsewhere.json",
           "EVOLVE_WORKSPACE": str(tmp_path / "ws")}
    out = subprocess.run(["bash", "run.sh", "--model", "/models/qwen3", "--budget", "1m"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    search = [line for line in calls.read_text().splitlines() if line.startswith("-m evolve run")]
    assert len(search) == 1 and "--model-config /models/qwen3/config.json --weight-dir /models/qwen3 " in search[0]
    assert search[0].endswith("--budget 1m") and "--model " not in search[0]
