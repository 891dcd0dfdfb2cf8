"""Judging in a child process: every failure of the candidate is a verdict."""
import os
import time

from contract.devices import core_siblings, parse_cpus
from fitness.judge import Judge, kept_off
from fitness.sandbox import judge
from fitness.wire import spin_until_readable
from fitness.adversaries import planted
from tests.conftest import SEED_ENGINE


def run_judge(path, small_target, scratch, **options):
    config_path, weight_dir = small_target
    options.setdefault("bench", "none")
    return judge(path, config_path, weight_dir, "cpu", scratch=str(scratch), **options)


def test_seed_engine_is_ok_with_its_evidence(small_target, scratch):
    verdict = run_judge(SEED_ENGINE, small_target, scratch, seed=5, timeout=120)
    assert verdict["status"] == "ok", verdict["error"]
    assert verdict["seed"] == 5 and 0 < verdict["worst_ratio"] < 0.5
    assert len(verdict["source_hash"]) == 16


def test_a_judge_removes_the_scratch_it_made_and_keeps_one_it_was_given(tmp_path):
    made = Judge("cpu")  # a judgement's derived weights go there: hundreds of MB on a large target
    (made.scratch / "weights.pt").write_bytes(b"0")
    made.close()
    assert not made.scratch.exists()
    given = Judge("cpu", scratch=tmp_path)
    given.close()
    assert tmp_path.is_dir()


def test_relative_paths_are_the_callers_not_the_runners(small_target, tmp_path, monkeypatch):
    """The runner works in a directory of its own: every path the judge hands it is
    absolute (a relative runs/ scratch once made every judgement of a search a crash)."""
    monkeypatch.chdir(tmp_path)
    config_path, weight_dir = small_target
    verdict = judge(SEED_ENGINE, config_path, weight_dir, "cpu", scratch="relative/scratch", seed=5,
                    timeout=120, bench="none", level="screen")
    assert verdict["status"] == "ok", verdict["error"]
    assert (tmp_path / "relative" / "scratch").is_dir()


def test_planted_fault_is_incorrect_with_stage_and_case(small_target, scratch, tmp_path):
    verdict = run_judge(planted.write_faulty("rows_reversed", tmp_path), small_target, scratch, timeout=120)
    assert verdict["status"] == "incorrect"
    assert verdict["stage"] == "target" and "tolerance" in verdict["error"]


def test_crashing_engine_gives_crash(small_target, scratch, tmp_path):
    verdict = run_judge(planted.write_faulty("crashes_in_prefill", tmp_path), small_target, scratch, timeout=120)
    assert verdict["status"] == "crash"
    assert "planted crash" in verdict["error"]


def test_hanging_engine_gives_timeout_within_its_limit(small_target, scratch, tmp_path):
    started = time.monotonic()
    verdict = run_judge(planted.write_faulty("hangs_in_decode", tmp_path), small_target, scratch, timeout=15)
    assert verdict["status"] == "timeout"
    assert "left of the judgement's time" in verdict["error"], verdict["error"]
    assert time.monotonic() - started < 25


def test_dead_interpreter_gives_crash(small_target, scratch, tmp_path):
    path = tmp_path / "exits.py"
    path.write_text(SEED_ENGINE.read_text().replace(
        "    return Engine(model_config, weight_dir, device)",
        "    import os\n    os._exit(3)"))
    verdict = run_judge(path, small_target, scratch, timeout=60)
    assert verdict["status"] == "crash" and "exited 3" in verdict["error"]


def test_foreign_import_is_invalid_without_running(small_target, scratch, tmp_path):
    verdict = run_judge(planted.write_faulty("imports_numpy", tmp_path), small_target, scratch, timeout=60)
    assert verdict["status"] == "invalid" and verdict["stage"] == "static"
    assert "numpy" in verdict["error"]


def test_greedy_cpu_candidate_is_a_crash_not_the_oom_killer(small_target, scratch, tmp_path):
    path = tmp_path / "greedy.py"
    path.write_text(planted.edit(SEED_ENGINE.read_text(), "    return Engine(model_config, weight_dir, device)",
                                 "    hog = torch.ones(2**40, dtype=torch.uint8)  # a terabyte\n"
                                 "    return Engine(model_config, weight_dir, device)"))
    verdict = run_judge(path, small_target, scratch, timeout=60)
    assert verdict["status"] == "crash" and "alloc" in verdict["error"].lower(), verdict["error"]


def test_a_busy_wait_returns_on_input_and_counts_only_time_awake():
    read_fd, write_fd = os.pipe()
    try:
        started = time.monotonic()
        assert not spin_until_readable(read_fd, 0.05)  # nothing came: it gave up after its budget
        assert 0.05 <= time.monotonic() - started < 1.0
        os.write(write_fd, b"x")
        started = time.monotonic()
        assert spin_until_readable(read_fd, 10.0)  # input: at once, not after the budget
        assert time.monotonic() - started < 1.0
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_cpu_lists_and_a_thread_kept_off_the_timing_core():
    assert parse_cpus("0-3,8") == {0, 1, 2, 3, 8}
    cores = sorted(os.sched_getaffinity(0))
    assert cores[-1] in core_siblings(cores[-1])
    with kept_off(frozenset({cores[-1]})):
        inside = os.sched_getaffinity(0)
    assert os.sched_getaffinity(0) == set(cores)  # given back
    assert inside == (set(cores) - {cores[-1]} or set(cores))  # a lone core is not taken away
