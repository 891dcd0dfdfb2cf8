"""The trusted side of judging: one process that never imports a candidate.

A `Judge` owns a device: the reference models and their cached logits, the clock, the
comparison, and the runner processes (fitness.runner) in which candidates run. Judging a
file: static checks here, then the candidate is imported in a fresh runner, driven
through the gate's traces (outputs compared here), then timed from here, against a
baseline program in a second runner when one is given (fitness.timing). Whatever the
candidate does (raise, hang, die, corrupt its CUDA context, lie) ends as a verdict; its
runner is killed after every judgement and never reused. The baseline's runner (a
program judged before) is kept, stopped, for the next judgement beside it.

A group of files (`judge_group`) is judged at once: their imports and the checks of their
outputs run side by side, each runner on a core of its own; every run (its engine made
first) is alone on the stage; they are timed in the same rounds beside the baseline.

Levels: "screen" (target traces, unit-scaled weights, timing), "full" (adds the churn
check and the derived configs), "none" (timing only, for programs judged before).
"""
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from contract.devices import core_siblings, is_cuda
from contract.loader import source_hash
from contract.model_config import ConfigError, ModelConfig
from fitness import gate, weight_files
from fitness.candidate import CandidateError, RunnerFailure, Spares, kill_orphans
from fitness.cases import CASE_SETS, select_cases
from fitness.own_code import CodeChanged, OwnCode
from fitness.reference_logits import References
from fitness.runner import output_checksum
from fitness.timing import (CHECKED_ROWS, RESOLUTION, Contender, TimedOutputCheck, check_warm_up, measure,
                            warm_up)
from fitness.traces import call_message, materialize
from fitness.verdict import STATUSES, error_text, new_verdict

LEVELS = ("none",) + gate.LEVELS
BENCH_CHOICES = ("none",) + CASE_SETS
# Judgements one baseline runner serves before it is started afresh (a sweep times every
# child beside the seed: its import and warm-up are paid once, not every time).
KEPT_RUNNER_USES = 16


class RunnerDriver:
    """Runs traces in a runner process. A run is two steps: `go` (alone on the stage: a
    fresh engine made there, then the calls; every run alike, checked or timed) and `fetch`."""

    def __init__(self, process, device: str, deadline: float, home_cpu=None, stage=None):
        self.process, self.device, self.deadline = process, device, deadline
        self.home_cpu, self.stage = home_cpu, stage or Stage(device)
        self.vocab_size = None
        self.last_seconds, self.last_checksum, self.last_peak_bytes = 0.0, None, 0
        self.last_shared_outputs = 0  # the runner's word: only ever explains a failed check

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def prepare(self, config, weight_dir, new_engine: bool = True):
        """Send `prepare` where the runner is; returns the wait for its answer. It carries
        nothing of the run."""
        raw = config.to_dict() if isinstance(config, ModelConfig) else config
        self.vocab_size = raw["vocab_size"]
        return self.process.send("prepare", self.left(), config=raw, weight_dir=str(weight_dir),
                                 device=self.device, new_engine=new_engine)

    def go(self, config, weight_dir, events, seed: int, new_engine: bool = True, staged: bool = False) -> float:
        """One run, alone on the stage (`Stage.alone`): its engine made there (untimed; a fresh
        one unless not `new_engine`), its tokens drawn here meanwhile, then on the clock each
        call sent once the one before has returned (CandidateProcess.timed_run), or, `staged`,
        every call handed over first and made in one go (CandidateProcess.staged_run: the
        evaluator's protocol). The seconds of the run.

        The engine is made where and right before it runs, as the evaluator's process makes
        the engine it then times, and with no clock burst before the run, as the evaluator
        makes none. With every engine made at once on home cores first and a 20 ms burst
        before each run, the judge ranked a device-bound program's decode 6-10% higher than
        the evaluator does, made so 0.995-1.011 of it, mixed 0.979-1.027 (H200,
        docs/log/2026-12-01-every-run-made-on-the-stage.md; the staged runs' own steps there:
        docs/log/2026-11-30-staged-group-vs-one-runner.md, 2026-11-30-staged-checksum-burst.md)."""
        with self.stage.alone(self) as awake:
            made = self.prepare(config, weight_dir, new_engine)
            planned = self.planned(events, seed)
            made()
            run = self.process.staged_run if staged else self.process.timed_run
            self.last_seconds, self.last_checksum = run(planned, self.left(), awake)
        return self.last_seconds

    def planned(self, events, seed: int) -> list:
        """The run's calls, tokens drawn here, written ahead for the slot (Slot.plan)."""
        calls = materialize(events, self.vocab_size, seed, "cpu")
        return self.process.slot.plan([call_message(call) for call in calls])

    def fetch(self, events) -> list:
        """One output per call (None for removes, a type name for a non-tensor answer)."""
        header, outputs = self.process.request("fetch", self.left())
        if len(outputs) != len(events):
            raise gate.CorrectnessError(f"{len(outputs)} outputs for {len(events)} calls")
        if self.last_checksum != output_checksum(outputs):  # the runner's sum, recomputed on what it sent
            raise gate.CorrectnessError("the outputs fetched are not those the timed run answered for")
        self.last_peak_bytes = int(header.get("peak_bytes", 0))
        self.last_shared_outputs = int(header.get("shared_outputs", 0))
        return [None if e.kind == "remove" else out for e, out in zip(events, outputs)]

    def run_trace(self, config, weight_dir, events, seed: int, new_engine: bool = True) -> list:
        self.go(config, weight_dir, events, seed, new_engine)
        return self.fetch(events)

    def place(self, cpu) -> None:
        """Move the runner's main thread (where the engine's host work runs) to `cpu`."""
        if cpu is not None:
            try:
                os.sched_setaffinity(self.process.proc.pid, {cpu})
            except ProcessLookupError:  # it died; the next request says how
                pass

    def retained_bytes(self) -> int:
        header, _ = self.process.request("memory", self.left())
        return int(header["retained_bytes"])


class Stage:
    """Where every run goes, one at a time and each alike, so that nothing a runner can
    observe tells a checked run from a timed one (tests/test_cheats.py records what it can):
    every other runner stopped (SIGSTOP: a neighbour cannot slow it down by working behind
    its back, nor tell by their state that it is timed); on a GPU, the runner on the timing
    core (`TimingCores`) and the judge waiting busy off that core. What timing needs for
    precision, every run gets."""

    def __init__(self, device: str, timing=None):
        self.device, self.timing = device, timing
        self.lock = threading.Lock()
        self.runners = set()  # every runner process of the judge, stopped while another runs

    @contextlib.contextmanager
    def alone(self, driver: RunnerDriver):
        """The run's placement; yields whether the judge waits busy (on a GPU)."""
        with self.lock:
            self.runners = {p for p in self.runners if not p.closed}
            others = [p for p in self.runners if p is not driver.process]
            for process in others:
                process.pause()
            kill_orphans()
            try:
                cpu = self.timing.current() if self.timing is not None else None
                driver.place(cpu)
                with kept_off(core_siblings(cpu) if cpu is not None else frozenset()):
                    yield cpu is not None
            finally:
                driver.place(driver.home_cpu)  # its fetch and what follows, off the timing core
                for process in others:
                    process.resume()


class TimingCores:
    """The core a timed run goes to, on a GPU. Beside a baseline: the judge's last core,
    which no runner calls home; both contenders of a round meet its state, and their ratio
    cancels it (the seed beside itself: ratios' CV 1.3%). Alone (`rotating`): the judge's
    cores in turn, one a round. The GPU machines' cores have slow spells of their own lasting
    seconds (only 8-18% of a core's variance is shared by all), and a judgement alone on one
    core took its spell whole: the seed's fitness drew a CV of 8% over five judgements of
    20 rounds on one core, 4% in turn over 16
    (docs/log/2026-11-24-search-480ebbd-decode-kernel-costs.md)."""

    def __init__(self, cores):
        self.cores, self.turn, self.rotating = list(cores), 0, False

    @property
    def quiet(self):
        return self.cores[-1]

    def current(self):
        return self.cores[self.turn % len(self.cores)] if self.rotating else self.quiet

    def advance(self) -> None:
        self.turn += 1


@contextlib.contextmanager
def kept_off(cpus):
    """The calling thread kept off `cpus` for the block."""
    before = os.sched_getaffinity(0)
    if not cpus or not before - cpus:
        yield
        return
    os.sched_setaffinity(0, before - cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Judge:
    def __init__(self, device: str, env: dict | None = None, scratch=None, threads: int | None = None,
                 spare_ahead: bool = True):
        """`spare_ahead`: keep a runner started for the next judgement (a judge that judges once
        has no next one)."""
        self.device, self.threads = device, threads
        self.own_code = OwnCode.of_this_process()  # before any candidate runs: checked after every judgement
        self.references = References(device)
        self.spares = Spares(device, {**(env or {}), "OMP_NUM_THREADS": "1"} if is_cuda(device) else env,
                             ahead=spare_ahead)
        # Absolute: the runner works in a directory of its own, where a relative path names
        # nothing (every judgement was a crash). One made here goes at close: the derived
        # configs' weights in it reach hundreds of MB on a large target.
        self.own_scratch = scratch is None
        self.scratch = Path(scratch or tempfile.mkdtemp(prefix="judge_weights_")).resolve()
        self.kept = None  # the last baseline's runner, warm, for the next judgement beside it
        self.vouched = frozenset()  # the judgement's vouched-for source hashes (judge_group)
        # Threads that only wait on runners: the untimed work of a group runs at once.
        self.helpers = ThreadPoolExecutor(MAX_GROUP + 1, thread_name_prefix="untimed")
        # On a GPU: each runner on a core of its own between its runs (imports and fetches
        # go on at once); every run, its engine made first, as TimingCores says, the quiet
        # core's SMT siblings, if any, left to it.
        cores = sorted(os.sched_getaffinity(0))
        self.timing = TimingCores(cores) if is_cuda(device) else None
        self.stage = Stage(device, self.timing)
        quiet = core_siblings(cores[-1])
        self.home_cpus = ([c for c in cores if c not in quiet] or cores[:-1] or cores) if is_cuda(device) else [None]

    def close(self) -> None:
        self.drop_kept()
        self.spares.close()
        self.helpers.shutdown()
        if self.own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def judge(self, path, config_path, weight_dir, seed: int, **options) -> dict:
        """The verdict on `path`; options as judge_group's."""
        return self.judge_group([path], config_path, weight_dir, seed, **options)[0]

    def judge_group(self, paths, config_path, weight_dir, seed: int, margin: float = gate.DEFAULT_MARGIN,
                    level: str = "full", bench: str = "public", baseline=None, min_rounds: int = 3,
                    max_rounds: int = 8, timeout: float = 600.0, resolution: float = RESOLUTION,
                    rounds_within: float | None = None, weights_fingerprint=None, staged: bool = False,
                    source_hashes: dict | None = None, config_fingerprint=None, vouched=()) -> list:
        """A verdict on each of `paths` (at most MAX_GROUP), each timed beside `baseline` (a
        program judged before) in the same interleaved rounds: the baseline's runs serve
        every candidate's comparison. Their gates and warm-ups go on for all at once, each run
        alone on the stage. `weights_fingerprint`: weight_dir's weight files
        as the caller found them before any candidate ran (fitness.weight_files), and
        `config_fingerprint` the config file so; every verdict is `invalid` at stage `weights`
        if a trusted file changed. `staged`:
        beside a baseline, every case is also timed with its inputs staged before the clock,
        as the evaluator's protocol has them (the verdict's `staged_ratio`). `source_hashes`:
        {path: the source hash its caller wrote it with}; a file that differs is not judged
        (one program may rewrite another's file: every file is read once, here, before any
        program of the judgement runs, and each runner runs the text read). `vouched`: the
        source hashes of programs whose code the caller vouches for (the repository's, made by
        its operators); only a runner that ran none but these adds the kernels it compiled to
        Triton's shared cache, for any other could plant one under a key a rival compiles later."""
        assert level in LEVELS and bench in BENCH_CHOICES and 0 < len(paths) <= MAX_GROUP, (level, bench, paths)
        group = Group.begin(paths, self.device, seed, level, timeout, rounds_within, self.references.computed_s)
        # Absolute paths: the runner works in a directory of its own.
        weight_path = Path(weight_dir).resolve()
        baseline_path = Path(baseline).resolve() if baseline is not None and bench != "none" else None
        hashes = source_hashes or {}
        self.vouched = frozenset(vouched)
        try:
            group.setting = self.set_up(group, config_path, weight_path, seed, margin, level, bench,
                                        (weights_fingerprint, config_fingerprint), hashes)
            with blamed_on_baseline():
                baseline_source = None if baseline_path is None else read_source(baseline_path, hashes)
            self.import_candidates(group)
            if baseline_path is not None and group.live():
                self.start_baseline(group, baseline_path, baseline_source)
            group.mark("gate")
            self.for_each(group.live(), self.untimed, group.setting)
            if bench != "none" and group.live():
                self.time_group(group, min_rounds, max_rounds, resolution, staged and baseline_path is not None)
        except Exception as err:  # the config, the baseline, or our reading of a runner's answer
            group.fail_live(err)
        finally:
            self.end_group(group)
        return group.verdicts()

    def set_up(self, group: "Group", config_path, weight_dir: Path, seed: int, margin: float, level: str,
               bench: str, fingerprints: tuple, source_hashes: dict) -> "Setting":
        """Static checks of every candidate, then what they are all judged with
        (`fingerprints`: the weights' and the config's, as judge_group's)."""
        for entry in group.entries:
            entry.attempt(self.static_check, entry, source_hashes, stage="static")
        weights_fingerprint, config_fingerprint = fingerprints
        weight_files.TRUSTED.trust(config_path, config_fingerprint)
        config = ModelConfig.load(config_path)
        weight_files.TRUSTED.trust(weight_dir, weights_fingerprint)
        weight_files.TRUSTED.check()  # nothing changed since the last judgement's end
        self.references.model(config, weight_dir)  # missing or misshapen weights: invalid
        raw_config = json.loads(Path(config_path).read_text())  # the engine gets the file as it is
        cases = select_cases(bench) if bench != "none" else {}
        check = TimedOutputCheck(self.references, config, weight_dir, margin,
                                 CHECKED_ROWS["cuda" if is_cuda(self.device) else "cpu"])
        return Setting(config, raw_config, weight_dir, seed, margin, level, cases, check)

    def import_candidates(self, group: "Group") -> None:
        """Each live candidate imported in a fresh runner of its own, on its home core."""
        group.mark("import")
        live = group.live()
        for entry, process in zip(live, self.spares.take_many(len(live))):
            entry.bind(self.driver(process, group.deadline, self.home_cpus[entry.index % len(self.home_cpus)]))
            entry.attempt(self.load, entry.driver, entry.path, entry.source, stage="import")

    def start_baseline(self, group: "Group", path: Path, source: str) -> None:
        """The baseline's runner; on a GPU its warm-up begins beside the candidates' gates."""
        with blamed_on_baseline():
            group.base = self.baseline(path, source, group.deadline)
        if not group.base.warm and is_cuda(self.device):  # a CPU has no idle cores to lend it
            setting = group.setting
            group.warming = self.helpers.submit(warm_up, group.base.driver, setting.cases, setting.raw_config,
                                                setting.weight_dir)

    def time_group(self, group: "Group", min_rounds: int, max_rounds: int, resolution: float,
                   staged: bool = False) -> None:
        """The live candidates' timed rounds, beside the baseline when there is one."""
        live, setting = group.live(), group.setting
        group.mark("timing")
        with blamed_on_baseline():
            if group.base is not None and not group.base.warm:
                self.finish_baseline_warm_up(group)
            self.spares.settle()
            # Only the baseline's failures leave `measure`: a candidate's is its own.
            with self.cores_for(alone=group.base is None) as next_round:
                outcome = measure([e.contender for e in live], group.base.contender() if group.base else None,
                                  setting.cases, setting.raw_config, setting.weight_dir, self.device, setting.check,
                                  min_rounds, max_rounds, lambda: group.rounds_end - time.monotonic(), resolution,
                                  next_round, staged)
        for entry in live:
            entry.record_timing(outcome, setting.cases)

    def finish_baseline_warm_up(self, group: "Group") -> None:
        """The baseline's warm-up (begun beside the gates, or run now) checked: it is warm."""
        setting = group.setting
        if group.warming is not None:
            runs = group.warming.result()
        else:
            runs = warm_up(group.base.driver, setting.cases, setting.raw_config, setting.weight_dir)
        group.warming = None
        check_warm_up(setting.check, "baseline", runs)
        group.base.warm = True

    def end_group(self, group: "Group") -> None:
        """Whatever happened: the kept baseline settled, the candidates' runners closed, the
        weights checked, and every verdict completed."""
        self.settle_kept(group)
        for entry in group.entries:
            if entry.driver is not None:
                entry.driver.process.close()
        self.check_files_after(group)
        group.complete(self.references.computed_s)

    def settle_kept(self, group: "Group") -> None:
        """The baseline's runner after a judgement: kept paused for the next one beside it, or
        dropped when it failed (the next judgement starts it afresh)."""
        if group.warming is not None:  # the judgement ended before the baseline's warm-up was checked
            try:
                check_warm_up(group.setting.check, "baseline", group.warming.result())
                group.base.warm = True
            except Exception:
                self.drop_kept()
        if any(e.verdict["stage"] == "baseline" for e in group.entries):
            self.drop_kept()
        if self.kept is not None:
            self.kept.driver.process.pause()  # idle until the next judgement beside it

    def check_files_after(self, group: "Group") -> None:
        """No candidate's code runs now (the kept baseline is paused): did one change the
        trusted weights, or the code that judges? Then every verdict is invalid."""
        try:
            weight_files.TRUSTED.check()
            self.own_code.check()
        except (weight_files.WeightsChanged, CodeChanged) as err:
            self.drop_kept()
            for entry in group.entries:
                entry.fail(err, "files")

    @contextlib.contextmanager
    def cores_for(self, alone: bool):
        """The timing cores' rule for one measurement; yields measure's `next_round`."""
        if self.timing is None or not alone:
            yield None
            return
        self.timing.rotating = True
        try:
            yield self.timing.advance
        finally:
            self.timing.rotating = False

    def driver(self, process, deadline: float, home_cpu) -> RunnerDriver:
        """A driver for a runner of this judge's: its runs go on the judge's stage."""
        self.stage.runners.add(process)
        return RunnerDriver(process, self.device, deadline, home_cpu, self.stage)

    def static_check(self, entry: "Entry", source_hashes: dict) -> None:
        entry.source = source = read_source(entry.path, source_hashes)
        entry.verdict["source_hash"] = source_hash(source)
        problems = gate.static_problems(source)
        if problems:
            entry.end("invalid", "static", "; ".join(problems))

    def for_each(self, entries: list, fn, *args) -> None:
        """fn(entry, *args) for every entry at once (each waits on its own runner)."""
        for future in [self.helpers.submit(fn, entry, *args) for entry in entries]:
            future.result()

    def untimed(self, entry: "Entry", setting: "Setting") -> None:
        """The gate's traces, then the warm-up engine's run of every case (when timed)."""
        if setting.level != "none":
            result = entry.attempt(gate.run_gate, entry.driver, self.references, setting.config, setting.weight_dir,
                                   setting.seed, self.scratch, setting.margin, setting.level, stage="target")
            if result is None:
                return
            entry.verdict.update(worst_ratio=result.worst_ratio, worst_case=result.worst_case)
            if not result.passed:
                entry.verdict["case"] = result.case
                return entry.end("incorrect", result.stage, result.error)
        if setting.cases:
            runs = entry.attempt(warm_up, entry.driver, setting.cases, setting.raw_config, setting.weight_dir,
                                 stage="timed")
            if runs is not None:
                entry.attempt(check_warm_up, setting.check, entry.contender.name, runs, stage="timed")

    def load(self, driver: RunnerDriver, path, source: str) -> None:
        """`path`'s `source` imported in the driver's fresh runner, on its home core."""
        driver.place(driver.home_cpu)
        # One thread on a GPU: the runner is pinned to one core, where OpenMP threads
        # would only wait on each other (seen: 25 s judgements became 185 s).
        threads = 1 if is_cuda(self.device) else self.threads
        driver.process.loaded(source_hash(source) in self.vouched)
        driver.process.request("load", driver.left(), path=str(Path(path).resolve()), source=source, threads=threads)

    def baseline(self, path: Path, source: str, deadline: float) -> "KeptRunner":
        """The baseline's runner: the one kept from the last judgement when it ran the same
        program (warm: imported, its warm-up engine made) and has not served too long."""
        key = (str(path), source_hash(source))
        kept = self.kept
        if kept is not None and (kept.key != key or kept.uses >= KEPT_RUNNER_USES or not kept.warm
                                 or kept.driver.process.proc.poll() is not None):
            self.drop_kept()
        if self.kept is None:  # it outlives the judgement: not among the runners closed with it
            driver = self.driver(self.spares.take_many(1)[0], deadline, self.home_cpus[-1])
            self.kept = KeptRunner(key, driver)
            self.load(driver, path, source)
        self.kept.driver.process.resume()
        self.kept.driver.deadline = deadline
        self.kept.driver.process.spent.clear()  # this judgement's account starts now
        self.kept.uses += 1
        return self.kept

    def drop_kept(self) -> None:
        if self.kept is not None:
            self.kept.driver.process.close()
            self.kept = None


def vouched_for(paths) -> list:
    """judge_group's `vouched` for the files at `paths` (None skipped): programs the caller trusts."""
    return [source_hash(Path(path).read_text()) for path in paths if path is not None]


def read_source(path: Path, source_hashes: dict) -> str:
    """The file's text; a ChangedOnDisk error when its hash is not the one its caller wrote
    it with (`source_hashes`: {path: hash})."""
    source = Path(path).read_text()
    expected = source_hashes.get(str(Path(path).resolve()))
    if expected is not None and source_hash(source) != expected:
        raise ChangedOnDisk(f"{path} is not the program it was written as (source hash {source_hash(source)}, "
                            f"expected {expected}): a program judged before rewrote it")
    return source


class ChangedOnDisk(Exception):
    """A program's file is not what its caller wrote."""


class BaselineFailure(Exception):
    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


@contextlib.contextmanager
def blamed_on_baseline():
    """What fails in here is the baseline's (or the judge's), not a candidate's."""
    try:
        yield
    except Exception as err:
        raise BaselineFailure(err) from err


# Candidates judged at once beside one baseline: every untimed step of each on a core
# of its own, and the baseline's timed runs shared by all.
MAX_GROUP = 6


@dataclass
class Entry:
    """One candidate of a group judgement, and its verdict as it forms."""
    index: int
    path: Path
    verdict: dict
    stage: str = "static"
    source: str = ""  # the file's text, read once (Judge.static_check)
    driver: RunnerDriver | None = None
    contender: Contender | None = None

    @property
    def alive(self) -> bool:
        return not self.verdict["status"]

    def bind(self, driver: RunnerDriver) -> None:
        self.driver, self.contender = driver, Contender(f"candidate{self.index}", driver)

    def attempt(self, fn, *args, stage: str):
        """fn(*args) at `stage`; None, and the verdict its failure earns, if it raises."""
        self.stage = stage
        if not self.alive:
            return None
        try:
            return fn(*args)
        except Exception as err:
            self.fail(err, stage)
            return None

    def fail(self, err: Exception, stage: str) -> None:
        if isinstance(err, gate.GateFailure):  # the candidate's, on one config: its stage, not "target"
            self.fail(err.cause, err.stage)
            self.verdict.update(case=err.label, error=f"{err.where}: {self.verdict['error']}")
        elif isinstance(err, BaselineFailure):  # not the candidate's doing; still no verdict on it
            status = err.cause.status if isinstance(err.cause, RunnerFailure) else \
                "invalid" if isinstance(err.cause, ChangedOnDisk) else "crash"
            self.end(status, "baseline", f"the baseline failed: {error_text(err.cause)}")
        elif isinstance(err, ConfigError):
            self.end("invalid", "config", str(err))
        elif isinstance(err, ChangedOnDisk):
            self.end("invalid", stage, str(err))
        elif isinstance(err, weight_files.WeightsChanged):  # by one of the programs that ran
            self.end("invalid", "weights", str(err))
            self.verdict["weights_changed"] = True
        elif isinstance(err, CodeChanged):  # so: no later judgement of this judge is trusted either
            self.end("invalid", "code", str(err))
            self.verdict["code_changed"] = True
        elif isinstance(err, gate.CorrectnessError):
            self.end("incorrect", stage, str(err))
        elif isinstance(err, RunnerFailure):
            self.end(err.status, stage, str(err))
        elif isinstance(err, CandidateError):
            self.end("crash", stage, str(err))
        else:
            self.end("crash", stage, error_text(err))

    def end(self, status: str, stage: str, error: str) -> None:
        assert status in STATUSES, status
        self.verdict.update(status=status, stage=stage, error=error)

    def record_timing(self, outcome, cases: dict) -> None:
        contender = self.contender
        if contender.failure is not None:
            return self.fail(contender.failure, "timed")
        self.verdict.update(tokens_per_second=contender.tokens_per_second(cases), rounds=contender.rounds,
                            fitness_cv=contender.fitness_cv(cases), peak_memory_mb=contender.peak_bytes / 2**20,
                            timings={name: contender.seconds[name] for name in cases})
        if outcome.baseline is not None:
            ratio, low, high = outcome.ratio(contender)
            baseline = outcome.baseline
            self.verdict.update(baseline_tokens_per_second=baseline.tokens_per_second(cases),
                                baseline_timings={name: baseline.seconds[name] for name in cases},
                                ratio=ratio, ratio_low=low, ratio_high=high)
            staged = outcome.staged_ratio(contender)
            if staged is not None:
                self.verdict.update(zip(("staged_ratio", "staged_ratio_low", "staged_ratio_high"), staged))
                self.verdict.update(staged_timings=dict(contender.staged_seconds),
                                    baseline_staged_timings=dict(baseline.staged_seconds))


@dataclass
class KeptRunner:
    key: tuple  # (path, source hash) of the program it runs
    driver: RunnerDriver
    uses: int = 0  # judgements it served
    warm: bool = False  # its warm-up ran and was checked

    def contender(self) -> Contender:
        return Contender("baseline", self.driver)


@dataclass(frozen=True)
class Setting:
    """What every candidate of a group is judged with."""
    config: ModelConfig
    raw_config: dict  # the config file as it is: what the engines get
    weight_dir: Path
    seed: int  # the gate traces' tokens
    margin: float
    level: str
    cases: dict  # the timed cases; {} when not timed
    check: TimedOutputCheck  # of timed outputs, the warm-ups' included


@dataclass
class Group:
    """One group judgement as it goes: its candidates, its clock, the baseline's runner."""
    entries: list
    started: float
    deadline: float  # every runner's requests end by then
    rounds_end: float  # no timed round starts that would end past this (the first always runs)
    marks: list  # (stage, when it began): where the seconds went
    references_from: float  # the judge's References.computed_s when it began
    setting: Setting | None = None  # once the config and weights are read
    base: KeptRunner | None = None
    warming: Future | None = None  # the baseline's warm-up, run beside the gates, until checked

    @classmethod
    def begin(cls, paths, device: str, seed: int, level: str, timeout: float, rounds_within: float | None,
              references_s: float):
        started, deadline = time.monotonic(), time.monotonic() + timeout
        # The caller's budget for the rounds.
        rounds_end = min(deadline, started + rounds_within) if rounds_within is not None else deadline
        entries = [Entry(i, Path(path), new_verdict(path, device, seed)) for i, path in enumerate(paths)]
        for entry in entries:
            entry.verdict.update(level=level, group=len(entries))
        return cls(entries, started, deadline, rounds_end, [("setup", time.monotonic())], references_s)

    def mark(self, stage: str) -> None:
        self.marks.append((stage, time.monotonic()))

    def live(self) -> list:
        return [e for e in self.entries if e.alive]

    def fail_live(self, err: Exception) -> None:
        """Every candidate without a verdict fails at its stage."""
        for entry in self.live():
            entry.fail(err, entry.stage)

    def complete(self, references_s: float) -> None:
        """Those that failed nothing are ok; every verdict gets its seconds and phases, among
        them the seconds its gate spent computing reference logits (`references_s`: the
        judge's References.computed_s now), which a run's final pays afresh on traces of its own."""
        for entry in self.entries:
            if entry.alive:
                entry.end("ok", "", "")
            entry.verdict["seconds"] = round(time.monotonic() - self.started, 3)
            runners = [entry.driver.process] if entry.driver else []
            runners += [self.base.driver.process] if self.base else []
            entry.verdict["phases"] = phases(self.marks, runners)
            # What fitness.isolation could not close in the runners this verdict rests on ("": nothing).
            entry.verdict["open_layers"] = "; ".join(sorted({r.open_layers for r in runners if r.open_layers}))
            entry.verdict["phases"]["references"] = round(references_s - self.references_from, 3)

    def verdicts(self) -> list:
        return [entry.verdict for entry in self.entries]


def phases(marks: list, runners: list) -> dict:
    """Seconds per stage of a judgement, and per request kind summed over its runners
    (start: the process; load: the engine's module; prepare: making engines; run: the
    calls; fetch: the outputs' transfer)."""
    ends = [when for _, when in marks[1:]] + [time.monotonic()]
    spent = {stage: round(end - began, 3) for (stage, began), end in zip(marks, ends)}
    for runner in runners:
        for op, seconds in runner.spent.items():
            spent[f"runner_{op}"] = round(spent.get(f"runner_{op}", 0.0) + seconds, 3)
    return spent
