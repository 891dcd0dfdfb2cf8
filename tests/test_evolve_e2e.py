"""The search end to end on CPU with the real judge (child processes), on the small target."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mutations
from evolve import checkpoint, history, library
from evolve.__main__ import main
from evolve.config import RunConfig
from evolve.search import run
from evolve.merge import MERGE_EVERY_GAIN
from fitness import isolation
from fitness.sandbox import judge
from mutations import recipe
from mutations.crossover import MERGE_NAME, NAME as CROSSOVER
from tests import some_real_operators, subreaper
from tests.conftest import SEED_ENGINE

REPO = Path(__file__).resolve().parent.parent


def real_operators() -> dict:
    """Six real operators, the real crossover (tests/some_real_operators.py says why six)."""
    return {"mutate_fn": some_real_operators.random_mutation, "mate_fn": some_real_operators.crossover}


def judged_ok(engine: Path, small_target, tmp_path) -> dict:
    config_path, weight_dir = small_target
    verdict = judge(engine, config_path, weight_dir, "cpu", timeout=300, scratch=str(tmp_path / "scratch"),
                    threads=1, level="full", bench="none")
    assert verdict["status"] == "ok", verdict
    return verdict


def test_two_generations_with_the_real_operators_and_judge(small_target, tmp_path):
    config_path, weight_dir = small_target
    config = RunConfig.build("cpu", model_config=config_path, weight_dir=weight_dir, population=3,
                             generations=2, derived=False, final_top=1, timeout_s=120.0, rng_seed=3,
                             runs_dir=tmp_path / "runs", workspace=tmp_path / "ws",
                             history=tmp_path / "history.csv")
    assert run(config, **real_operators()) == 0
    frame = history.read(config.history)
    judged = history.judged_rows(frame)
    # The loop ran generations 0-2 and judged in 0 and 1; six operators can leave generation 2
    # nothing new (CI saw 10 children, all cached). The final's rows carry the number after the
    # last; a first judgement there is the closing merge, when it was new.
    log = (config.workspace / "results.log").read_text()
    assert [int(g) for g in re.findall(r"^gen +(\d+) \|", log, re.M)] == [0, 1, 2]
    assert {0, 1} <= set(judged["generation"]) <= {0, 1, 2, 3}
    assert (judged["generation"] == 3).sum() <= 1
    assert judged["operator"].iloc[0] == "seed" and judged["status"].iloc[0] == "ok"
    known = {op.name for op in mutations.all_operators()} | {CROSSOVER, MERGE_NAME, MERGE_EVERY_GAIN}
    assert set(judged["operator"].iloc[1:]) <= known  # every child made by a real operator
    assert not judged["candidate_id"].duplicated().any()
    assert frame["tps_prefill_4x32"].notna().any()  # a CPU run times the small cases
    # Each row says what its runners went without: what this machine leaves open, "" when nothing.
    assert set(judged["open_layers"]) == {"; ".join(isolation.open_here())}
    phases = json.loads(judged["judge_phases"].iloc[0])  # the seed's: where its seconds went
    assert {"import", "gate", "timing", "runner_prepare", "runner_run", "references"} <= set(phases)
    assert 0 < phases["gate"] + phases["timing"] <= judged["judge_seconds"].iloc[0]
    assert 0 < phases["references"] <= phases["gate"]  # the run's first gate computes its reference logits
    assert "winner" in log and "lineage:" in log and "roofline" in log
    judged_ok(config.workspace / "engine.py", small_target, tmp_path)
    # The shipped library is GPU recipes: each declined, saying so; the winner joins the run's.
    declined = frame[frame["status"] == "declined"]
    shipped = {r.name for r in library.read_all([library.SHIPPED])}
    assert {e.split(":")[0] for e in declined.loc[declined["stage"] == "library", "error"]} == shipped
    assert declined.loc[declined["stage"] == "library", "error"].str.contains("needs a GPU").all()
    winner = (only_run_dir(config.runs_dir) / "winner.py").read_text()
    if winner != SEED_ENGINE.read_text():
        kept = library.read_all([config.library_dir])
        assert [recipe.apply(list(r.steps)) for r in kept] == [winner] or "library: the winner is not added" in log


def only_run_dir(runs_dir: Path) -> Path:
    (run_dir,) = [p for p in runs_dir.iterdir() if p.name != "gate_weights"]
    return run_dir


def evolve_command(small_target, tmp_path, *extra) -> list:
    config_path, weight_dir = small_target
    return [sys.executable, "-m", "evolve", "run", "--model-config", str(config_path),
            "--weight-dir", str(weight_dir), "--device", "cpu", "--population", "3", "--no-derived",
            "--runs-dir", str(tmp_path / "runs"), "--workspace", str(tmp_path / "ws"),
            "--history", str(tmp_path / "history.csv"), "--final-top", "1",
            "--operators", "tests.test_evolve_stand_in", *extra]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigterm_mid_run_leaves_a_correct_engine_and_a_resumable_run(small_target, tmp_path):
    history_path = tmp_path / "history.csv"
    # Through the subreaper: the run's judges and runners (sessions of their own) that outlive
    # it become the wrapper's children, and it exits with LEAKED.
    proc = subprocess.Popen([sys.executable, "-m", "tests.subreaper",
                             *evolve_command(small_target, tmp_path, "--budget", "10m")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Killed in generation 1, after the seed and at least one child were judged.
        wait_for(lambda: history_path.exists() and len(history.judged_rows(history.read(history_path))) >= 2,
                 240, "two judgements")  # besides the library's declines, recorded first
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != subreaper.LEAKED, "a judge or runner outlived the run:\n" + out
    assert proc.returncode == 143, out
    assert "resume with" in out
    judged_ok(tmp_path / "ws" / "engine.py", small_target, tmp_path)
    warnings = []
    frame = history.read(history_path, warn=warnings.append)
    assert not warnings and len(frame) >= 2
    run_dir = only_run_dir(tmp_path / "runs")
    state = checkpoint.load(run_dir)
    assert state["generation"] >= 1 and not state["finished"]
    assert not [p for p in os.listdir(run_dir / "candidates") if p.endswith(".tmp")]

    # The run goes on where it stopped: same run id, the generation count continued. The
    # operators module is not a setting the run keeps: named again, the stand-ins breed.
    resumed = subprocess.run([sys.executable, "-m", "evolve", "run", "--resume", str(run_dir),
                              "--generations", str(state["generation"]), "--operators", "tests.test_evolve_stand_in"],
                             cwd=REPO, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"gen {state['generation']:>3}" in resumed.stdout
    after = history.read(history_path)
    assert set(after["run_id"]) == {state["run_id"]}
    # Counted on, not from 0. The stand-ins may breed only cached children, so a row is not
    # promised: the checkpoint's count is (CI saw generation 1 and a final judge nothing new).
    assert (after["generation"].iloc[len(frame):] >= state["generation"]).all()
    finished = checkpoint.load(run_dir)
    assert finished["finished"] and finished["generation"] > state["generation"]
    assert [r["gen"] for r in finished["logbook"]][-1] == state["generation"]
    assert f"resumed at generation {state['generation']}" in (tmp_path / "ws" / "results.log").read_text()
    judged_ok(tmp_path / "ws" / "engine.py", small_target, tmp_path)


def bad_target(tmp_path, small_target, change):
    config_path, weight_dir = small_target
    raw = json.loads(Path(config_path).read_text())
    change(raw)
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps(raw))
    return path, weight_dir


@pytest.mark.parametrize("change, message", [
    (lambda raw: raw.pop("hidden_size"), "lacks hidden_size"),
    (lambda raw: raw.update(num_hidden_layers=3), "lacks"),
    (lambda raw: raw.update(vocab_size=300), "has shape"),
])
def test_bad_config_or_weights_stop_before_any_work(small_target, tmp_path, capsys, change, message):
    config_path, weight_dir = bad_target(tmp_path, small_target, change)
    status = main(["run", "--model-config", str(config_path), "--weight-dir", str(weight_dir),
                   "--device", "cpu", "--runs-dir", str(tmp_path / "runs"),
                   "--workspace", str(tmp_path / "ws"), "--history", str(tmp_path / "h.csv")])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "h.csv").exists()
    assert not (tmp_path / "ws").exists()


def test_the_subreaper_sees_a_process_that_outlives_its_command():
    escapes = ("import subprocess as s; print(s.Popen(['sleep', '30'], start_new_session=True, "
               "stdout=s.DEVNULL, stderr=s.DEVNULL).pid)")  # not the pipes: they end with the wrapper
    out = subprocess.run([sys.executable, "-m", "tests.subreaper", sys.executable, "-c", escapes],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    os.kill(int(out.stdout.split()[0]), signal.SIGKILL)
    assert out.returncode == subreaper.LEAKED and "outlived" in out.stdout
    clean = subprocess.run([sys.executable, "-m", "tests.subreaper", sys.executable, "-c", "raise SystemExit(3)"],
                           cwd=REPO, timeout=60)
    assert clean.returncode == 3


def test_the_budget_counts_from_the_process_start():
    """--budget is the whole run's: what the process spent before the search (a second of
    sleep here; importing torch and checking the target on a GPU host, ~10 s) is spent."""
    code = "import time; time.sleep(1.0); from evolve.__main__ import process_age_s; print(process_age_s())"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 1.0 <= float(done.stdout) <= time.monotonic() - started + 0.5
