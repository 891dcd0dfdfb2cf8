"""tools.timed_run_overhead's timeline and its napping stage (the rest of the tool needs a GPU: tests/test_gpu.py)."""
import os
import re
import time
import types

import torch

from fitness.judge import Stage, TimingCores
from tools import timed_run_overhead


class ClockEvent:
    """A CUDA event on a device that is never busy: reached when recorded."""

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1e3  # ms, as CUDA's


class SleepyEngine:
    def prefill(self, ids, tokens):
        return tokens

    def decode(self, ids):
        time.sleep(0.002)
        return ids

    def remove(self, ids):
        return None


def test_the_timeline_splits_each_call_s_time_inside_the_engine_from_the_time_between(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", ClockEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    engine = SleepyEngine()
    timeline = timed_run_overhead.Timeline(engine)
    for _ in range(3):
        engine.decode([1])
        time.sleep(0.004)  # the runner's work between calls
    engine.remove([1])
    figures = dict(re.findall(r"(\w+ \w+) (\d+) us", timeline.summary()))
    assert timeline.summary().startswith("4 calls; ")
    # Three 2 ms calls inside, three 4 ms gaps between (the last call, remove, has no gap after it).
    assert int(figures["device inside"]) >= 6000 and int(figures["device between"]) >= 12000
    for where in ("inside", "between"):  # the device's events pair as the host's clock does
        assert abs(int(figures[f"device {where}"]) - int(figures[f"host {where}"])) < 500, figures


def test_the_timeline_names_each_call_and_the_time_before_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", ClockEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    engine = SleepyEngine()
    timeline = timed_run_overhead.Timeline(engine)
    engine.decode([1])
    time.sleep(0.004)
    engine.remove([1])
    first, second = timeline.calls()
    assert (first["kind"], second["kind"]) == ("decode", "remove")
    assert "device_before" not in first and first["device_inside"] >= 2000
    assert second["device_before"] >= 4000 and abs(second["device_before"] - second["host_before"]) < 500


def test_a_napping_stage_places_the_run_as_the_judge_does_but_never_waits_busy():
    """judge_staged_nap: the run on the timing core, the judge napping (awake False)."""
    placed = []
    cores = sorted(os.sched_getaffinity(0))
    stage = timed_run_overhead.NappingStage("cuda", TimingCores(cores))
    driver = types.SimpleNamespace(process=object(), place=placed.append, home_cpu=cores[0])
    with stage.alone(driver) as awake:
        assert awake is False
    with Stage("cuda", TimingCores(cores)).alone(driver) as awake:
        assert awake is True  # the judge's own stage waits busy on a GPU
    assert placed == [cores[-1], cores[0]] * 2


def test_bench_pinned_makes_the_calls_on_one_core_and_one_thread_then_gives_them_back():
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    seen = []

    class Engine:
        def decode(self, ids, tokens):
            seen.append((os.sched_getaffinity(0), torch.get_num_threads()))
            return tokens

    calls = [types.SimpleNamespace(event=types.SimpleNamespace(kind="decode"), request_ids=[0],
                                   tokens=torch.tensor([1]))] * 2
    assert timed_run_overhead.bench_run(Engine(), calls, "cpu", "bench_pinned") > 0
    assert seen == [({max(cores)}, 1)] * 2
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == (cores, threads)
