"""Judging programs in parallel: one worker per GPU (or per CPU slot), each a warm judge
process (fitness.sandbox.JudgeProcess) that starts a runner process per candidate.

A worker keeps its judge for the whole run: torch, the CUDA context, reference models and
reference logits are made once. Each worker has cores of its own (`cpus`), so two judges
never time a host-bound engine on the same core. The threads here only wait on judges.

A generation is judged in two steps: every new program is `screen`ed (target traces, timed
beside its parent, interleaved); those that could enter the hall of fame are then
`confirm`ed (derived configs and churn too, timed beside the best program so
far). Programs with no judged parent (the seed, --seed-from) are judged in full at once.
"""
import functools
import hashlib
import os
import queue
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from evolve import history
from evolve.config import format_duration, visible_gpus
from evolve.program import made_here
from evolve.scores import Scores, geometric_mean_tps
from evolve.workspace import write_atomically
from fitness.judge import MAX_GROUP
from fitness.own_code import CodeChanged, OwnCode
from fitness.sandbox import JudgeProcess
from fitness.weight_files import WeightsChanged, fingerprint

# A judgement may run this long past the budget, so one slow candidate cannot sink it.
MAX_OVERRUN_S = 120.0
MIN_TIMEOUT_S = 60.0
# A GPU batch's verdicts judged again alone before they count (runners side by side share
# the card's memory; on a CPU each runner has its own memory limit: a crash is its own).
RETRIED_ALONE = ("crash", "timeout")
FINAL, CONFIRM = history.FINAL, history.CONFIRM


@dataclass
class Worker:
    index: int
    env: dict = field(default_factory=dict)  # for the judge process: its GPU, its threads
    cpus: list = field(default_factory=list)  # the cores its judge and runners keep to
    judge: object = None  # the JudgeProcess, started on first use

    def device_name(self, device: str) -> str:
        """"cuda:2" for the physical GPU this worker is pinned to, else the device."""
        gpu = self.env.get("CUDA_VISIBLE_DEVICES")
        return f"{device}:{gpu}" if gpu else device


def core_shares(cores: list, num_workers: int) -> list:
    """Disjoint, contiguous slices of `cores`, one per worker; [] each (no pinning) when
    there are fewer cores than workers."""
    if len(cores) < num_workers:
        return [[] for _ in range(num_workers)]
    size = len(cores) // num_workers
    return [cores[i * size:(i + 1) * size] for i in range(num_workers)]


def make_workers(config) -> list[Worker]:
    """One worker per visible GPU (round robin when asked for more), or N CPU workers, each
    with its own cores and as many threads as it has cores."""
    shares = core_shares(sorted(os.sched_getaffinity(0)), config.workers)
    gpus = visible_gpus() or ["0"]
    workers = []
    for i, cpus in enumerate(shares):
        threads = str(max(1, len(cpus))) if config.device == "cuda" else "1"
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        if config.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        scratch = Path(config.runs_dir) / "gate_weights" / f"worker{i}"
        judge = JudgeProcess(config.device, env, ",".join(map(str, cpus)), scratch)
        workers.append(Worker(i, env, cpus, judge))
    return workers


class WorkerPool:
    """`map(fn, *iterables)` with each call given a free worker: fn(*args, worker=w)."""

    def __init__(self, workers: list[Worker]):
        self.workers = workers
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
        """End the judgements in flight (on Ctrl-C or SIGTERM) and the judges."""
        self.stopping.set()
        self.close()
        self.executor.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        for worker in self.workers:
            if worker.judge is not None:
                worker.judge.stop()


@dataclass(frozen=True)
class ProgramBatch:
    """Programs judged together on one worker, each beside the same baseline at the same
    level (fitness.judge.Judge.judge_group); `label` names a re-judgement (confirm, final)."""
    programs: tuple
    label: str | None
    level: str
    baseline_id: str | None


@dataclass(frozen=True)
class BatchPhases:
    """Where a batch's wall seconds went, as its judge said."""
    wall: float
    gate: float  # the gates, `references` among them
    timing: float
    references: float  # computing reference logits the judge had not kept


class Evaluator:
    """toolbox.evaluate: judge a batch of programs on a worker, record a row for each,
    keep the scores."""

    def __init__(self, config, run, scores, hist: history.History, stopping: threading.Event,
                 time_left, judge_fn=None, final_reserve=lambda: 0.0, known=lambda program_id: None):
        self.config, self.run, self.scores, self.history = config, run, scores, hist
        self.stopping, self.time_left = stopping, time_left
        # Seconds kept for the final comparison: no other batch starts inside them, or a last
        # generation's batches take the final's time and the winner is never compared with
        # the seed (docs/log/2026-11-22-prefill-cuda-graphs-one-kernel-rope.md).
        self.final_reserve = final_reserve
        self.judge_fn = judge_fn  # None: the worker's judge; else one path at a time (tests' stand-ins)
        self.batch_seconds = {}  # level -> wall seconds of each batch judged (the budget's estimates)
        self.batch_phases = {}  # level -> BatchPhases of each batch whose judge said them
        self.batches_started, self.start_lock = 0, threading.Lock()  # batches begun (workers' threads count them)
        # Gate traces and their reference logits are the same for every judgement of a
        # run (computed once, by each judge); timed runs draw fresh tokens every time.
        self.gate_seed = int(hashlib.sha256(run.run_id.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF
        # The target's weights as found before any candidate of this run ran: a judge
        # started later (a replaced worker, the final's) must not trust a changed file.
        self.weights_fingerprint = fingerprint(config.weight_dir)
        self.config_fingerprint = fingerprint(config.model_config)
        self.sources = {}  # id -> source of every program written: a rewritten file is restored
        self.known = known  # id -> the program, or None: the search's memo, which holds lineages
        self.made_here = {}  # id -> whether its code is the repository's alone (evolve.program.made_here)
        # The code that judges, as found before any candidate ran: a judge started after one
        # rewrote it (one killed its judge, say) would not say so itself.
        self.own_code = OwnCode.of_this_process()

    def timeout(self, size: int = 1) -> float:
        """The configured timeout (half as much again for each program beyond the first of
        a batch), cut short near the end of the budget."""
        return min(self.config.timeout_s * (1 + (size - 1) / 2), max(MIN_TIMEOUT_S, self.time_left() + MAX_OVERRUN_S))

    def __call__(self, batch: ProgramBatch, generation: int, worker: Worker) -> list:
        """(fitness, verdict) of each program of the batch; (None, None) each when the
        budget ran out before it started (for all but the final, when a batch like it would
        end inside the final's reserve): nothing is recorded, and a resumed run judges them."""
        if not self.may_start(batch):
            return [(None, None)] * len(batch.programs)
        with self.start_lock:
            self.batches_started += 1
        paths = self.write_programs(batch)
        options = {**self.judge_options(batch, len(paths)), "source_hashes": self.source_hashes(batch, paths),
                   "vouched": self.vouched(batch)}
        started = time.monotonic()
        verdicts = self.judge(paths, options, worker)
        if self.stopping.is_set():  # killed by us, not by the candidate: nothing to record
            return [(None, verdict) for verdict in verdicts]
        wall = time.monotonic() - started
        share = self.account(batch.level, wall, verdicts)
        results = [self.result(program, path, verdict, share, generation, batch, worker)
                   for program, path, verdict in zip(batch.programs, paths, verdicts)]
        print(progress_line(generation, batch, results, wall, self.time_left()), flush=True)
        stop_if_files_changed(verdicts, batch, self.own_code)
        self.history.check()  # RecordsChanged: a candidate wrote the run's records
        self.run.checkpoint.check()
        return results

    def may_start(self, batch: ProgramBatch) -> bool:
        """Time is left, and (but for the final) a batch like it would end before the final's reserve."""
        if batch.label != FINAL and self.time_left() - self.expected_seconds(batch.level) <= self.final_reserve():
            return False
        return self.time_left() > 0

    def write_programs(self, batch: ProgramBatch) -> list:
        """The path of each program's file, written when missing or not its program, and the
        baseline's restored so: a candidate runs as the search's user and can rewrite any
        program's file (one that slowed its baseline's file was judged 1.47x the seed)."""
        paths = [self.run.candidate_path(program) for program in batch.programs]
        for program, path in zip(batch.programs, paths):
            self.sources[program.id] = program.source
            restore(path, program.source)
        baseline = self.baseline_path(batch)
        if baseline is not None and batch.baseline_id in self.sources:
            restore(baseline, self.sources[batch.baseline_id])
        return paths

    def baseline_path(self, batch: ProgramBatch) -> Path | None:
        """The file of the program the batch is timed beside; None when there is none."""
        path = self.scores.by_id[batch.baseline_id].source_path if batch.baseline_id else ""
        return Path(path) if path else None

    def source_hashes(self, batch: ProgramBatch, paths: list) -> dict:
        """{path: the hash its program was written with}, the baseline's among them: the
        judge judges no file a program rewrote since."""
        hashes = {str(path.resolve()): program.id for program, path in zip(batch.programs, paths)}
        baseline = self.baseline_path(batch)
        if baseline is not None:
            hashes[str(baseline.resolve())] = batch.baseline_id
        return hashes

    def vouched(self, batch: ProgramBatch) -> list:
        """The ids (source hashes) of the batch's programs, its baseline among them, whose code
        is the repository's alone: only their runners add the kernels they compile to Triton's
        shared cache (fitness.judge)."""
        for program in [*batch.programs, self.known(batch.baseline_id)]:
            if program is not None and program.id not in self.made_here:
                self.made_here[program.id] = made_here(program, self.known, self.made_here)
        return sorted({i for i in [*(p.id for p in batch.programs), batch.baseline_id] if self.made_here.get(i)})

    def judge_options(self, batch: ProgramBatch, size: int) -> dict:
        """Keyword arguments of the judgement of a batch of `size`, all but the worker."""
        is_final = batch.label == FINAL
        baseline = self.baseline_path(batch)
        options = dict(timeout=self.timeout(size), baseline=baseline, seed=None if is_final else self.gate_seed,
                       weights_fingerprint=self.weights_fingerprint, config_fingerprint=self.config_fingerprint,
                       **self.config.judge_options(batch.level, final=is_final))
        # Fewer rounds rather than the final's time: a last batch of near-equal children would
        # run every round it may and leave no final (docs/log/2026-11-23-cv-of-a-judgement.md).
        # The final's rounds end with the budget: a close call may run all of final_rounds,
        # twice its reckoning (a 4-minute CPU run's closing merge took 57 s of a 37 s final),
        # and one left undecided keeps the floor.
        reserve = 0.0 if is_final else self.final_reserve()
        options["rounds_within"] = max(0.0, self.time_left() - reserve)
        return options

    def judge(self, paths: list, options: dict, worker: Worker) -> list:
        """A verdict on each path, or None for one not judged."""
        if self.judge_fn is None:
            return worker.judge.judge_group(paths, self.config.model_config, self.config.weight_dir, **options)
        # One by one, each only while the budget lasts.
        return [self.judge_fn(path, self.config.model_config, self.config.weight_dir, self.config.device,
                              worker=worker, **options) if self.time_left() > 0 else None for path in paths]

    def account(self, level: str, wall: float, verdicts: list) -> float:
        """The batch's wall time, process start included, kept for the budget's estimates;
        each judgement's share of it (what the budget paid for it)."""
        self.batch_seconds.setdefault(level, []).append(wall)
        phases = next((v["phases"] for v in verdicts if v is not None and v.get("phases")), {})
        if "gate" in phases and "timing" in phases:  # a group's stages: the same in each of its verdicts
            self.batch_phases.setdefault(level, []).append(
                BatchPhases(wall, phases["gate"], phases["timing"], phases.get("references", 0.0)))
        return round(wall / max(1, sum(v is not None for v in verdicts)), 3)

    def result(self, program, path, verdict: dict | None, share: float, generation: int, batch: ProgramBatch,
               worker: Worker) -> tuple:
        """(fitness, verdict) of one program of the batch, recorded; judged again alone first
        when it may have been crowded out."""
        if verdict is None:
            return None, None
        if len(batch.programs) > 1 and verdict["status"] in RETRIED_ALONE and self.config.device == "cuda":
            # Crowded out, maybe: programs side by side share the GPU's memory (runners of
            # 7 GB K/V slabs put the baseline out of memory). Alone, it is its own.
            print(f"  {program.id} judged again alone: {verdict['status']} in a batch of {len(batch.programs)} "
                  f"({last_line(verdict.get('error', ''))})", flush=True)
            return self(ProgramBatch((program,), batch.label, batch.level, batch.baseline_id), generation, worker)[0]
        return self.record(program, path, {**verdict, "seconds": share}, generation, batch, worker)

    def expected_seconds(self, level: str) -> float:
        """How long a batch of `level` is expected to take: the mean of those so far. A batch
        must end before the final's reserve, not merely start before it (a 29 s confirmation
        started 66 s before the end ran into the final's 40 s:
        docs/log/2026-11-23-why-search-stops-short-of-recipe.md)."""
        walls = self.batch_seconds.get(level)
        return sum(walls) / len(walls) if walls else 0.0

    def record(self, program, path, verdict: dict, generation: int, batch: ProgramBatch, worker: Worker) -> tuple:
        fitness = geometric_mean_tps(verdict)
        # A label names a re-judgement; a program's first row names the operator that made
        # it (the final's closing merge is judged first there).
        label = batch.label if program.id in self.scores else None
        self.scores.add(program.id, verdict["status"], fitness, verdict.get("peak_memory_mb"),
                        verdict["seconds"], path, verdict.get("tokens_per_second"), batch.level)
        if batch.baseline_id and verdict["status"] == "ok":
            self.scores.compare(program.id, batch.baseline_id, verdict.get("ratio"), verdict.get("ratio_low"),
                                verdict.get("ratio_high"), verdict.get("rounds"))
        self.history.append({
            **self.run.row_base(generation), "candidate_id": program.id,
            "parent_ids": program.parent_ids, "operator": label or program.operator,
            "operator_args": program.operator_args if label is None else {},
            "source_path": str(path.resolve()), **history.verdict_row(verdict, fitness),
            # The level the search asked for: "full" confirms a program even where the run
            # has no derived configs to judge (--no-derived).
            "level": batch.level, "baseline_id": batch.baseline_id or "",
            "device": worker.device_name(self.config.device)})
        return fitness, verdict


def restore(path: Path, source: str) -> None:
    """The file holds `source`: written when missing or other (atomically: a file on disk is
    always a whole program)."""
    try:
        if path.read_text() == source:
            return
    except (OSError, UnicodeDecodeError):
        pass
    write_atomically(path, source)


def progress_line(generation: int, batch: ProgramBatch, results: list, wall: float, left: float) -> str:
    """The console's line for a judged batch: a GPU generation can take minutes, and a
    10-minute Qwen3-0.6B run's generation 0 took 4m56s, its console silent
    (docs/log/2026-11-30-twenty-minute-run-ten-minute-qwen3-gate-seeds.md)."""
    verdicts = [verdict for _, verdict in results if verdict is not None]
    failed = [v["status"] for v in verdicts if v["status"] != "ok"]
    ok = [(fitness, p.id) for p, (fitness, verdict) in zip(batch.programs, results)
          if verdict is not None and verdict["status"] == "ok" and fitness]
    line = f"  gen {generation:>3} | {batch.label or batch.level} of {len(verdicts)}: {len(ok)} ok"
    line += "".join(f", {failed.count(s)} {s}" for s in sorted(set(failed)))
    if ok:
        fitness, best = max(ok)
        line += f", best {fitness:,.0f} tok/s [{best}]"
    return line + f" | {wall:.0f} s | {format_duration(left)} left"


def stop_if_files_changed(verdicts: list, batch: ProgramBatch, own_code: OwnCode) -> None:
    """WeightsChanged when a verdict says a candidate changed the target's weights, CodeChanged
    when one says (or the search finds) that one changed the code that judges: the verdicts
    are recorded, and the run stops, for no later verdict could be trusted."""
    judging = f"(judging {', '.join(p.id for p in batch.programs)})"
    changed = next((v for v in verdicts if v and v.get("weights_changed")), None)
    if changed is not None:
        raise WeightsChanged(f"{changed['error']} {judging}")
    said = next((v for v in verdicts if v and v.get("code_changed")), None)
    try:
        own_code.check()
    except CodeChanged as err:
        said = {"error": str(err)}
    if said is not None:
        raise CodeChanged(f"{said['error']} {judging}")


@dataclass(frozen=True)
class Judging:
    """What screens, confirmations and the final judge with, built once by Search: the
    toolbox (its `evaluate` and `map`), the scores they keep, the number of workers."""
    toolbox: object
    scores: Scores
    workers: int

    def run(self, generation: int, jobs: list) -> list:
        """run_jobs with these parts: (program, fitness, verdict) of each judged."""
        return run_jobs(self.toolbox, generation, jobs, self.workers, self.scores)


def unjudged(programs: list, scores) -> list:
    """The programs never judged, each source once however many copies of it there are."""
    return [p for p in {p.id: p for p in programs}.values() if p.id not in scores]


def screen(judging: Judging, generation: int, todo: list, beside: str | None = None) -> list:
    """Judge `todo`, sources never judged (`unjudged`): each beside its first judged parent
    (a screen), or with none beside `beside` (a program judged correct), or else in full.
    Returns the (fitness, verdict) pairs of their first judgements."""
    fallback = beside if beside is not None and judging.scores.is_ok(beside) else None
    parents = [first_judged_parent(p, judging.scores) or fallback for p in todo]
    first = judging.run(generation, [(p, None, "screen" if parent else "full", parent)
                                     for p, parent in zip(todo, parents)])
    return [(fitness, verdict) for _, fitness, verdict in first]


def confirm(judging: Judging, hall_of_fame, generation: int, programs: list, beside: str | None = None) -> None:
    """Judge in full, beside the champion, the screened programs that could enter the hall
    of fame (screened earlier but never confirmed, as when a run stopped between, counts).
    `beside`: a correct program to time them beside instead, and only those fitted faster
    than it (generation 0's floor: a 5-minute H200 run spent 42 s confirming a library
    program screened at 0.96x it, and 39 s more on the final)."""
    scores = judging.scores
    champion = hall_of_fame[0].id if len(hall_of_fame) else None
    unique = list({p.id: p for p in programs}.values())
    floor = beside if beside and scores.is_ok(beside) else None
    baseline = floor or champion
    todo = [p for p in worth_confirming(scores, hall_of_fame, unique, judging.workers)
            if p.id not in (champion, baseline) and not (floor and scores.speed(p.id) <= scores.speed(floor))]
    judging.run(generation, [(p, CONFIRM, "full", baseline) for p in todo])


def batches(jobs: list, workers: int, max_size=MAX_GROUP) -> list:
    """(program, label, level, baseline id) jobs as batches: those with the same label,
    level and baseline together, in as many batches as keep every worker busy, none
    larger than `max_size` (a number, or a function of the baseline id). Programs with no
    baseline are judged one by one."""
    groups = {}
    for program, label, level, baseline in jobs:
        groups.setdefault((label, level, baseline), []).append(program)
    out = []
    for (label, level, baseline), programs in groups.items():
        size_limit = max_size(baseline) if callable(max_size) else max_size
        count = len(programs) if baseline is None else max(-(-len(programs) // size_limit), min(workers, len(programs)))
        size = -(-len(programs) // count)
        out += [ProgramBatch(tuple(programs[i:i + size]), label, level, baseline) for i in range(0, len(programs), size)]
    return out


def group_size(peak_mb: float, device_mb: float | None) -> int:
    """Programs to judge side by side beside a baseline whose runner peaked at `peak_mb`
    (its warm-up engine and a timed one): each runner may hold twice as much (what its
    allocator keeps, graph pools), and with the baseline's they must fit in 70% of the
    card. Seen on an H100: runners of 7 GB K/V slabs failed even two beside one."""
    if not peak_mb or not device_mb:
        return MAX_GROUP
    return max(1, min(MAX_GROUP, int(0.7 * device_mb / (2 * peak_mb)) - 1))


def last_line(text: str, limit: int = 160) -> str:
    """The last line of an error (a traceback ends with the exception), for the console."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:limit]


@functools.cache
def gpu_memory_mb() -> float | None:
    """The first visible GPU's memory, from nvidia-smi (no CUDA context in this process)."""
    gpus = visible_gpus()
    if not gpus:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                              "-i", gpus[0]], capture_output=True, text=True, timeout=30).stdout
        return float(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def run_jobs(toolbox, generation: int, jobs: list, workers: int = 1, scores=None) -> list:
    """(program, label, level, baseline id) jobs, batched, in one parallel map; (program,
    fitness, verdict) of each that was judged."""
    if not jobs:
        return []

    def max_size(baseline_id):
        peaks = scores.by_id[baseline_id].memory_mb if scores is not None and baseline_id in scores.by_id else []
        return group_size(max(peaks, default=0.0), gpu_memory_mb())
    todo = batches(jobs, workers, max_size)
    results = toolbox.map(toolbox.evaluate, todo, [generation] * len(todo))
    return [(program, *result) for batch, answers in zip(todo, results) if answers is not None
            for program, result in zip(batch.programs, answers)
            if result[1] is not None]  # None: stopping, or out of time


def first_judged_parent(program, scores) -> str | None:
    """The first parent that was judged correct (the program is timed beside it)."""
    return next((pid for pid in program.parent_ids if scores.is_ok(pid)), None)


def worth_confirming(scores, hall, programs: list, limit: int) -> list:
    """Screened programs fast enough to enter the hall of fame `hall`, fastest first, at
    most `limit` (one per worker) per generation."""
    bar = scores.speed(hall[-1].id) if len(hall) >= hall.maxsize else 0.0
    fast = [p for p in programs if scores.is_ok(p.id) and not scores.is_confirmed(p.id) and scores.speed(p.id) > bar]
    fast.sort(key=lambda p: -scores.speed(p.id))
    return fast[:limit]
