"""Judging programs in parallel: one worker per GPU (or per CPU slot), each judgement a
fresh `python -m fitness.judgement` process started by fitness.sandbox.judge.

Threads are enough to spread the work: every judgement is its own process, so a crash,
hang or CUDA error costs one verdict and never a worker, and nothing is forked from a
process that holds CUDA state (spawn-safe by construction).
"""
import os
import queue
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from evolve import history
from evolve.scores import geometric_mean_tps
from evolve.workspace import write_atomically

# A judgement may run this long past the budget, so one slow candidate cannot sink it.
MAX_OVERRUN_S = 120.0
MIN_TIMEOUT_S = 60.0
CPU_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Worker:
    index: int
    env: dict = field(default_factory=dict)  # for the judgement process: its GPU, its threads

    def device_name(self, device: str) -> str:
        """"cuda:2" for the physical GPU this worker is pinned to, else the device."""
        gpu = self.env.get("CUDA_VISIBLE_DEVICES")
        return f"{device}:{gpu}" if gpu else device


def make_workers(config) -> list[Worker]:
    """One worker per visible GPU (round robin when asked for more), or N CPU workers.

    A CPU judgement runs on one thread: the small models judged on CPU gain nothing from
    more, and on a busy machine OpenMP threads that wait on each other made the gate
    50 times slower (and timings noisy); parallel workers never oversubscribe either.
    """
    if config.device == "cuda":
        from evolve.config import visible_gpus

        gpus = visible_gpus() or ["0"]
        return [Worker(i, {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]}) for i in range(config.workers)]
    return [Worker(i, dict(CPU_THREADS)) for i in range(config.workers)]


class WorkerPool:
    """`map(fn, *iterables)` with each call given a free worker: fn(*args, worker=w)."""

    def __init__(self, workers: list[Worker]):
        self.free = queue.Queue()
        for worker in workers:
            self.free.put(worker)
        self.executor = ThreadPoolExecutor(len(workers), thread_name_prefix="judge")
        self.stopping = threading.Event()

    def map(self, fn, *iterables) -> list:
        futures = [self.executor.submit(self.run_on_free_worker, fn, args) for args in zip(*iterables)]
        return [f.result() for f in futures]

    def run_on_free_worker(self, fn, args):
        if self.stopping.is_set():
            return None
        worker = self.free.get()
        try:
            return fn(*args, worker=worker)
        finally:
            self.free.put(worker)

    def stop(self) -> None:
        """Kill the judgements in flight and let the threads go (on Ctrl-C or SIGTERM)."""
        self.stopping.set()
        kill_judgement_processes()
        self.executor.shutdown(wait=True, cancel_futures=True)


def kill_judgement_processes() -> None:
    """SIGKILL the session of every judgement child of this process.

    The sandbox starts each child in a session of its own (so its timeout kills the
    candidate's children too); a Ctrl-C at the terminal does not reach it, and the thread
    waiting on it never sees the signal, so the main thread ends them here.
    """
    for pid in child_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"fitness.judgement" in cmdline:
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def child_pids() -> list[int]:
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:  # field 4, after the comm's ")"
            found.append(int(entry.name))
    return found


class Evaluator:
    """toolbox.evaluate: judge one program on a worker, record the row, keep the score."""

    def __init__(self, config, run, scores, hist: history.History, stopping: threading.Event,
                 time_left, judge_fn=None):
        self.config, self.run, self.scores, self.history = config, run, scores, hist
        self.stopping, self.time_left = stopping, time_left
        self.judge_fn = judge_fn or default_judge_fn

    def timeout(self) -> float:
        """The configured timeout, cut short near the end of the budget."""
        return min(self.config.timeout_s, max(MIN_TIMEOUT_S, self.time_left() + MAX_OVERRUN_S))

    def __call__(self, program, generation: int, remeasure: str | None, worker: Worker) -> tuple:
        """(fitness of this measurement, verdict); a re-measure is labelled by `remeasure`.
        (None, None) when the budget ran out before it started: nothing is recorded, and
        a resumed run judges it."""
        if self.time_left() <= 0:
            return None, None
        path = self.run.candidate_path(program)
        if not path.exists():  # atomically: a file on disk is always a whole program
            write_atomically(path, program.source)
        scratch = Path(self.config.runs_dir) / "gate_weights" / f"worker{worker.index}"
        started = time.monotonic()
        verdict = self.judge_fn(path, self.config.model_config, self.config.weight_dir, self.config.device,
                                timeout=self.timeout(), env=worker.env, scratch=str(scratch),
                                **self.config.judge_options(remeasure))
        if self.stopping.is_set():  # killed by us, not by the candidate: nothing to record
            return None, verdict
        fitness = geometric_mean_tps(verdict)
        # Wall time, process start included: what the budget pays for a judgement.
        verdict = {**verdict, "seconds": round(time.monotonic() - started, 3)}
        self.scores.add(program.id, verdict["status"], fitness, verdict.get("peak_memory_mb"),
                        verdict["seconds"], path, verdict.get("tokens_per_second"))
        self.history.append({
            **self.run.row_base(generation), "candidate_id": program.id,
            "parent_ids": program.parent_ids, "operator": remeasure or program.operator,
            "operator_args": program.operator_args if remeasure is None else {},
            "source_path": str(path.resolve()), **history.verdict_row(verdict, fitness),
            "device": worker.device_name(self.config.device)})
        return fitness, verdict


def default_judge_fn(*args, **kwargs) -> dict:
    from fitness.sandbox import judge

    return judge(*args, **kwargs)


def judge_unjudged(toolbox, scores, generation: int, programs, remeasure=(), label="retime") -> tuple:
    """Judge every source not judged before (once, however many copies of it there are),
    and re-measure `remeasure` under `label`, all in one parallel map.

    Returns the (fitness, verdict) pairs of the new sources and of the re-measures."""
    todo = list({p.id: p for p in programs if p.id not in scores}.values())
    again = [p for p in remeasure if p.id not in {t.id for t in todo}]
    jobs = [(p, None) for p in todo] + [(p, label) for p in again]
    results = toolbox.map(toolbox.evaluate, [p for p, _ in jobs], [generation] * len(jobs),
                          [lab for _, lab in jobs])
    done = [r if r is not None else (None, None) for r in results]  # None: the pool was stopping
    return ([r for r in done[:len(todo)] if r[1] is not None],
            [r for r in done[len(todo):] if r[1] is not None])
