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

from contract.loader import source_hash
from fitness import own_code
from fitness.gate import static_problems
from fitness.sandbox import JudgeProcess, judge
from fitness.weight_files import fingerprint
from fitness.adversaries import cheats
from fitness.adversaries.cheats import at_import
from tests.conftest import REPO, SEED_ENGINE, closed_off_here
from fitness.adversaries.planted import edit


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
    """Its calls and the end of its run answer before any call ran: the checksum it answers
    is not that of the outputs it sends later."""
    verdict = judged_beside_the_seed(cheats.write_cheat("answers_before_its_outputs", tmp_path), small_target, scratch)
    assert verdict["status"] == "incorrect", verdict
    assert "not those the timed run answered for" in verdict["error"], verdict


def test_a_cheat_that_rewrites_the_weights_fails_and_so_does_every_judgement_after(small_target, tmp_path,
                                                                                  open_runners):
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


def test_a_cheat_that_rewrites_its_rivals_files_is_timed_beside_them_as_they_were(small_target, scratch, tmp_path,
                                                                                   open_runners):
    """Every program of a search sits in one folder, and a candidate can write there: read after
    the cheat ran, its baseline's file slept 0.2 s a call (judged 1.47x the seed with 0.05 s).
    The judge reads every file before any program runs; a later judgement of a file a program
    rewrote, held to the hash it was written with, judges nothing."""
    config_path, weight_dir = small_target
    cheat, baseline = cheats.write_cheat("slows_its_rivals", tmp_path), tmp_path / "baseline.py"
    baseline.write_text(SEED_ENGINE.read_text())
    verdict = judge(cheat, config_path, weight_dir, "cpu", timeout=240, scratch=str(scratch), threads=1,
                    level="screen", bench="small", baseline=baseline, min_rounds=2, max_rounds=2)
    assert verdict["status"] == "ok" and verdict["ratio"] < 1.5, verdict
    assert verdict["open_layers"] == "all: RUNNER_ISOLATION=off"  # the verdict says its runners were open
    assert "_made_here = create_engine" in baseline.read_text()  # it did rewrite the file
    hashes = {str(baseline.resolve()): source_hash(SEED_ENGINE.read_text())}
    later = judge(SEED_ENGINE, config_path, weight_dir, "cpu", timeout=240, scratch=str(scratch), threads=1,
                  level="screen", bench="public", baseline=baseline, source_hashes=hashes)
    assert (later["status"], later["stage"]) == ("invalid", "baseline"), later
    assert "a program judged before rewrote it" in later["error"]


def test_a_cheat_that_rewrites_the_judges_code_leaves_an_invalid_verdict(small_target, tmp_path, open_runners):
    """Its rewritten loader slows every engine a runner started later loads but its own: the
    baseline's in this judgement (2.99x the seed, judged ok, before the judge watched its own
    code) and every rival's after. Judged by a copy of the judge, which it rewrites."""
    config_path, weight_dir = small_target
    repo = tmp_path / "repo"
    for package in own_code.PACKAGES:
        shutil.copytree(REPO / package, repo / package, ignore=shutil.ignore_patterns("__pycache__", "weights"))
    cheat = cheats.write_cheat("rewrites_the_judge", tmp_path / "programs")
    baseline = tmp_path / "programs" / "baseline.py"
    baseline.write_text(SEED_ENGINE.read_text())
    done = subprocess.run([sys.executable, "-m", "fitness", "judge", str(cheat), "--baseline", str(baseline),
                           "--model-config", str(config_path), "--weight-dir", str(weight_dir), "--device", "cpu",
                           "--bench", "none", "--no-derived"], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(repo)}, timeout=300)
    verdict = json.loads(done.stdout)
    assert "_load_slowly" in (repo / "contract" / "loader.py").read_text()  # it did rewrite the loader
    assert (verdict["status"], verdict["stage"]) == ("invalid", "code"), verdict
    assert verdict["code_changed"] and "contract/loader.py" in verdict["error"]


def test_a_closed_off_runner_can_write_nothing_but_its_scratch(small_target, tmp_path, monkeypatch):
    """The cheats that write files (a rival's engine, the weights, a library outside the
    trees the judge watches: that one judged ok at 4.19-4.48x the seed, doing its work) fail
    at their first write, and every file is as it was. Each sits in a folder beside a rival,
    with weights and a copy of the library of its own (were the defence gone, nothing shared
    would change)."""
    closed_off_here()
    config_path, weight_dir = small_target
    weights, library = tmp_path / "weights", tmp_path / "library"
    shutil.copytree(weight_dir, weights)
    library.mkdir()
    shutil.copy(sys.modules["typing_extensions"].__file__, library)
    monkeypatch.setenv("PYTHONPATH", str(library))  # the runners' typing_extensions is the copy
    names = ("slows_its_rivals", "rewrites_the_weights", "rewrites_a_library")
    paths = [cheats.write_cheat(name, tmp_path / name) for name in names]
    for name in names:
        (tmp_path / name / "rival.py").write_text(SEED_ENGINE.read_text())
    before = {path: path.stat().st_mtime_ns for path in [*tmp_path.rglob("*.py"), *weights.iterdir()]}
    judge_process = JudgeProcess("cpu", scratch=tmp_path / "scratch")
    try:
        verdicts = judge_process.judge_group(paths, config_path, weights, timeout=120, level="screen", bench="none")
    finally:
        judge_process.stop()
    assert all(v["status"] == "crash" and "Read-only file system" in v["error"] for v in verdicts), verdicts
    assert {path: path.stat().st_mtime_ns for path in before} == before


def test_a_cheat_that_kills_its_rivals_reaches_none(small_target, tmp_path):
    """It kills every other runner of its judge as it is imported: unfenced, its rival was
    judged `crash` ("killed by SIGKILL") and its own baseline failed. A closed-off runner may
    signal no process but itself, so both are judged at their speed."""
    closed_off_here()
    config_path, weight_dir = small_target
    rival = tmp_path / "rival.py"
    rival.write_text(SEED_ENGINE.read_text())
    judge_process = JudgeProcess("cpu", scratch=tmp_path / "scratch")
    try:
        verdicts = judge_process.judge_group([cheats.write_cheat("kills_its_rivals", tmp_path), rival], config_path,
                                             weight_dir, timeout=240, level="screen", bench="small",
                                             baseline=SEED_ENGINE, min_rounds=2, max_rounds=2)
    finally:
        judge_process.stop()
    assert [v["status"] for v in verdicts] == ["ok", "ok"], verdicts
    assert all(v["ratio"] < 1.5 and v["open_layers"] == "" for v in verdicts), verdicts  # closed off, all


def test_a_kernel_planted_in_the_cache_reaches_no_later_runner(small_target, tmp_path, monkeypatch):
    """It writes a kernel into Triton's cache under a key of its choosing (a rival's, were it
    to compute one). A closed-off runner writes to its scratch only, and before this the judge
    added what it wrote there to the shared cache, where every later runner would have read
    it; now only a runner of programs the caller vouched for adds its kernels."""
    closed_off_here()
    config_path, weight_dir = small_target
    shared = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared))
    path = cheats.write_cheat("plants_a_kernel", tmp_path)
    planted = shared / cheats.PLANTED_KEY / "planted.cubin"
    for vouched in ([], [source_hash(path.read_text())]):
        verdict = judge(path, config_path, weight_dir, "cpu", timeout=120, scratch=str(tmp_path / "scratch"),
                        threads=1, level="screen", bench="none", vouched=vouched)
        assert verdict["status"] == "ok" and verdict["open_layers"] == "", verdict
        assert planted.exists() == bool(vouched)  # the mechanism is the same: only the vouching differs


def test_a_config_rewritten_since_the_search_began_judges_nothing(small_target, tmp_path):
    """A judge reads the config anew for each judgement: one a candidate cut to a layer
    would judge every later program on another model."""
    config_path, weight_dir = small_target
    config = tmp_path / "model_config.json"
    config.write_text(config_path.read_text())
    before = fingerprint(config)
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_hidden_layers": 1}))
    judge_process = JudgeProcess("cpu", scratch=tmp_path / "scratch")  # a process of its own: it keeps distrusting
    try:
        verdict = judge_process.judge(SEED_ENGINE, config, weight_dir, timeout=120, level="screen", bench="none",
                                      config_fingerprint=before)
    finally:
        judge_process.stop()
    assert (verdict["status"], verdict["stage"]) == ("invalid", "weights"), verdict
    assert f"{config} changed on disk" in verdict["error"]


def test_a_cheat_whose_helpers_spin_while_others_run_is_timed_at_its_real_speed(small_target, tmp_path):
    """Its helpers, in sessions of their own (one orphaned), took the cores whenever its
    runner was stopped: ok at 4.60x the seed, doing the seed's work. Now every process
    descended from a runner is stopped with it, and a judge's process kills the orphans it
    adopts before every run."""
    config_path, weight_dir = small_target
    judge_process = JudgeProcess("cpu", scratch=tmp_path / "scratch")  # a judge's own process, as a search's
    try:
        verdict = judge_process.judge(cheats.write_cheat("spins_while_others_run", tmp_path), config_path,
                                      weight_dir, timeout=240, level="screen", bench="small", baseline=SEED_ENGINE,
                                      min_rounds=2, max_rounds=2)
    finally:
        judge_process.stop()
    assert verdict["status"] == "ok" and verdict["ratio"] < 1.5, verdict


@pytest.mark.parametrize("name", ["precomputes_from_frames", "precomputes_from_heap", "looks_ahead_within_a_run"])
def test_a_cheat_that_reads_inputs_before_they_are_due_finds_none_and_runs_at_its_real_speed(
        name, small_target, scratch, tmp_path):
    """No call's inputs exist in the runner before the call is due: the cheat finds no run
    to answer ahead (in create_engine, or at a run's first call), so it is the seed. A
    runner that drew its run's tokens before making the engine let the frames one answer
    every timed call from a table: 115x the seed on 2 cores
    (docs/log/2026-11-25-no-input-before-its-call.md)."""
    verdict = judged_beside_the_seed(cheats.write_cheat(name, tmp_path), small_target, scratch)
    assert verdict["status"] == "ok", verdict["error"]
    assert verdict["ratio"] < 1.5, verdict


def test_a_cheat_that_tells_a_timed_run_by_its_look_sees_it_in_every_run(small_target, scratch, tmp_path):
    """Every run is placed alike, the other runners stopped around each: the cheat that
    answers wrongly when it sees that is wrong in the gate, before any timing."""
    verdict = judged_beside_the_seed(cheats.write_cheat("lazy_when_placed_for_timing", tmp_path), small_target,
                                     scratch)
    assert (verdict["status"], verdict["stage"]) == ("incorrect", "target"), verdict


OBSERVER = '''import json as _json
_ENGINES = []


def _observe(request):
    """What this process can see of a run: its cores, its environment, the other runners'
    states, the engines alive, and the fields of the request that made this engine."""
    try:
        with open(f"/proc/{os.getppid()}/task/{os.getppid()}/children") as f:
            siblings = [int(p) for p in f.read().split() if int(p) != os.getpid()]
    except OSError:
        siblings = []
    states = []
    for pid in siblings:
        try:
            with open(f"/proc/{pid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass
    alive = sum(1 for ref in _ENGINES if ref() is not None)
    return {"cores": sorted(os.sched_getaffinity(0)), "env": sorted(os.environ.items()),
            "stopped": "T" in states, "engines": alive, "request": request}


def _record(engine, kind):
    with open(LOG, "a") as f:
        f.write(_json.dumps({"engine": id(engine), "kind": kind, **_observe(engine.request)}) + "\\n")'''


def observer(src: str, log) -> str:
    """The seed, recording at every call what its process can observe (OBSERVER) to `log`."""
    src = at_import(src, f"LOG = {str(log)!r}\n" + OBSERVER)
    src = edit(src, "    return Engine(model_config, weight_dir, device)\n",
               "    import sys, weakref\n"
               "    request = {k: v for k, v in sys._getframe(1).f_locals.items() if isinstance(v, bool)}\n"
               "    engine = Engine(model_config, weight_dir, device)\n"
               "    engine.request = request\n"
               "    _ENGINES.append(weakref.ref(engine))\n"
               "    return engine\n")
    src = edit(src, "        ids = as_id_list(request_ids)\n        lengths = [int(t.numel()) for t in input_ids]\n",
               "        _record(self, 'prefill')\n        ids = as_id_list(request_ids)\n"
               "        lengths = [int(t.numel()) for t in input_ids]\n")
    return edit(src, "        ids = as_id_list(request_ids)\n        start = [self.cache.length(rid) for rid in ids]\n",
                "        _record(self, 'decode')\n        ids = as_id_list(request_ids)\n"
                "        start = [self.cache.length(rid) for rid in ids]\n")


def test_a_checked_run_and_a_timed_run_look_the_same_from_inside(small_target, scratch, tmp_path, writable):
    """A program that records, at every call, what its process can observe (its cores, its
    environment, whether another runner is stopped, how many of its engines are alive, the
    request that made its engine) sees one thing in every run of a judgement: the gate's
    traces, the warm-up and the timed rounds beside a baseline."""
    log = writable / "seen.jsonl"
    path = tmp_path / "observer.py"
    path.write_text(observer(SEED_ENGINE.read_text(), log))
    verdict = judged_beside_the_seed(path, small_target, scratch)
    assert verdict["status"] == "ok" and verdict["rounds"] >= 2, verdict
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    first = seen[0]["engine"]
    # The gate's engines, the warm-up's and every timed one: more than a few runs each.
    assert len({s["engine"] for s in seen}) >= 6, seen
    # The runner's first engine lives through every later run (the contract's warm-up engine).
    assert {s.pop("engines") for s in seen if s["engine"] != first} == {2}
    kinds = {json.dumps({k: v for k, v in s.items() if k not in ("engine", "kind", "engines")}, sort_keys=True)
             for s in seen}
    assert len(kinds) == 1, sorted(kinds)
    assert json.loads(kinds.pop())["stopped"], "the baseline's runner was not stopped around the runs"


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
    # The clock runs at a tenth: ~10x alone; 3.7x on prefill once beside a busy test on 2 cores.
    assert all(fooled[case] > 3 * honest[case] for case in honest), (fooled, honest)


JUDGE_MEMORY_READER = '''def _read_the_judge():
    """What reading the judge's memory gives: 'read', or why not (where the GPU machines run
    everything as root, /proc/<judge>/mem held a run's tokens before the run)."""
    import os as _os
    judge = _os.getppid()
    try:
        with open(f"/proc/{judge}/maps") as maps:
            start = int(next(line for line in maps if "rw-p" in line).split("-")[0], 16)
        with open(f"/proc/{judge}/mem", "rb") as memory:
            memory.seek(start)
            memory.read(4096)
        return "read"
    except (OSError, StopIteration, ValueError) as err:
        return type(err).__name__


with open(LOG, "a") as _log:
    _log.write(_read_the_judge() + "\\n")'''


def test_a_runner_cannot_read_the_judges_memory(small_target, scratch, tmp_path, writable):
    """The judge's memory holds a run's tokens before the run: its runners cannot read it
    (the judge is not dumpable; a runner has no CAP_SYS_PTRACE, even as root)."""
    log = writable / "read.txt"
    path = tmp_path / "reader.py"
    path.write_text(at_import(SEED_ENGINE.read_text(), f"LOG = {str(log)!r}\n" + JUDGE_MEMORY_READER))
    config_path, weight_dir = small_target
    verdict = judge(path, config_path, weight_dir, "cpu", timeout=240, scratch=str(scratch), threads=1,
                    level="screen", bench="none")
    assert verdict["status"] == "ok", verdict
    assert log.read_text().split() == ["PermissionError"]
