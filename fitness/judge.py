"""The trusted side of judging: one process that never imports a candidate.

A `Judge` owns a device: the reference models and their cached logits, the clock, the
comparison, and the runner processes (fitness.runner) in which candidates run. Judging a
file: static checks here, then the candidate is imported in a fresh runner, driven
through the gate's traces (outputs compared here), then timed from here, against a
baseline program in a second runner when one is given (fitness.timing). Whatever the
candidate does (raise, hang, die, corrupt its CUDA context, lie) ends as a verdict; its
runner is killed after every judgement and never reused.

Levels: "screen" (target traces, unit-scaled weights, timing), "full" (adds the churn
check and the derived configs), "none" (timing only, for programs judged before).
"""
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fitness import gate
from fitness.candidate import CandidateError, RunnerFailure, Spares
from fitness.cases import CASE_SETS, select_cases
from fitness.devices import is_cuda, ramp_gpu_clocks
from fitness.loader import source_hash
from fitness.model_config import ConfigError, ModelConfig
from fitness.references import References
from fitness.runner import output_checksum
from fitness.timing import (CHECKED_ROWS, RESOLUTION, Contender, TimedOutputCheck, check_warm_up, measure,
                            warm_up)
from fitness.verdict import STATUSES, error_text, new_verdict

LEVELS = ("none",) + gate.LEVELS
# Before each timed run: the engine was just built on the host with the GPU idle, and an
# idle H100 drops its clocks within milliseconds; every run starts from the same state.
CLOCK_BURST_S = 0.02
BENCH_CHOICES = ("none",) + CASE_SETS
# Judgements one baseline runner serves before it is started afresh (a sweep times every
# child beside the seed: its import and warm-up are paid once, not every time).
KEPT_RUNNER_USES = 16


class RunnerDriver:
    """Runs traces in a runner process; every run goes through `go`, timed or not.

    A run is three steps, so a judge can overlap what is not timed: `prepare` (the
    engine, on the runner's own core, beside other runners preparing theirs), `go` (on
    the timing core, every other runner stopped, when timed) and `fetch`."""

    def __init__(self, process, device: str, deadline: float, home_cpu=None, timing_cpu=None):
        self.process, self.device, self.deadline = process, device, deadline
        self.home_cpu, self.timing_cpu = home_cpu, timing_cpu
        self.last_seconds, self.last_checksum, self.last_peak_bytes = 0.0, None, 0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def prepare(self, config, weight_dir, events, seed: int, new_engine: bool = True, keep_warm: bool = False):
        """Send `prepare`; returns the wait for its answer."""
        self.place(self.home_cpu)
        raw = config.to_dict() if isinstance(config, ModelConfig) else config
        return self.process.send("prepare", self.left(), config=raw, weight_dir=str(weight_dir),
                                 device=self.device, events=[event_fields(e) for e in events], seed=seed,
                                 keep_warm=keep_warm, new_engine=new_engine)

    def go(self, timed: bool = False) -> float:
        """Run the prepared calls. Every run is timed the same way; a `timed` one (a
        measurement) runs on the timing core, on a GPU whose clocks were just busy."""
        if timed:
            self.place(self.timing_cpu)
            ramp_gpu_clocks(self.device, CLOCK_BURST_S)
        self.last_seconds, self.last_checksum = self.process.timed_go(self.left())
        return self.last_seconds

    def fetch(self, events) -> list:
        """One output per call (None for removes, a type name for a non-tensor answer)."""
        header, outputs = self.process.request("fetch", self.left())
        if len(outputs) != len(events):
            raise gate.CorrectnessError(f"{len(outputs)} outputs for {len(events)} calls")
        if self.last_checksum != output_checksum(outputs):  # the runner's sum, recomputed on what it sent
            raise gate.CorrectnessError("the outputs fetched are not those the timed run answered for")
        self.last_peak_bytes = int(header.get("peak_bytes", 0))
        return [None if e.kind == "remove" else out for e, out in zip(events, outputs)]

    def run_trace(self, config, weight_dir, events, seed: int, new_engine: bool = True,
                  keep_warm: bool = False, timed: bool = False) -> list:
        self.prepare(config, weight_dir, events, seed, new_engine, keep_warm)()
        self.go(timed)
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


def event_fields(event) -> dict:
    return {"kind": event.kind, "request_ids": list(event.request_ids), "lengths": list(event.lengths),
            "ids_as_tensor": event.ids_as_tensor, "name": event.name}


class Judge:
    def __init__(self, device: str, env: dict | None = None, scratch=None, threads: int | None = None):
        self.device, self.threads = device, threads
        self.references = References(device)
        self.spares = Spares(device, {**(env or {}), "OMP_NUM_THREADS": "1"} if is_cuda(device) else env)
        # Absolute: the runner works in a directory of its own (seen: a relative runs/ dir
        # made every judgement of an H100 search a crash).
        self.scratch = Path(scratch or tempfile.mkdtemp(prefix="judge_weights_")).resolve()
        self.kept = None  # the last baseline's runner, warm, for the next judgement beside it
        self.background = ThreadPoolExecutor(1, thread_name_prefix="warm-up")
        # On a GPU: every timed run on one core (the last), each runner's untimed work on
        # a core of its own, so two runners can prepare engines at once.
        cores = sorted(os.sched_getaffinity(0))
        self.timing_cpu = cores[-1] if is_cuda(device) else None
        self.home_cpus = (cores[:-1] or cores) if is_cuda(device) else [None]

    def close(self) -> None:
        self.drop_kept()
        self.spares.close()
        self.background.shutdown()

    def judge(self, path, config_path, weight_dir, seed: int, margin: float = gate.DEFAULT_MARGIN,
              level: str = "full", bench: str = "public", baseline=None, min_rounds: int = 3,
              max_rounds: int = 8, timeout: float = 600.0, resolution: float = RESOLUTION) -> dict:
        """The verdict on `path`; `baseline` (a program judged before) is timed beside it."""
        assert level in LEVELS and bench in BENCH_CHOICES, (level, bench)
        started, deadline = time.monotonic(), time.monotonic() + timeout
        weight_dir = Path(weight_dir).resolve()  # the runner works in a directory of its own
        baseline = Path(baseline).resolve() if baseline is not None and bench != "none" else None
        verdict = new_verdict(path, self.device, seed)
        verdict["level"] = level
        runners, stage, warming, base = [], "static", None, None
        marks = [("setup", time.monotonic())]  # (stage, when it began): where the seconds went
        spent = {}  # and inside the timing stage
        try:
            source = Path(path).read_text()
            verdict["source_hash"] = source_hash(source)
            problems = gate.static_problems(source)
            if problems:
                return finish(verdict, started, "invalid", stage, "; ".join(problems))
            config = ModelConfig.load(config_path)
            self.references.model(config, weight_dir)  # missing or misshapen weights: invalid
            raw_config = json.loads(Path(config_path).read_text())  # the engine gets the file as it is
            cases = select_cases(bench) if bench != "none" else {}
            check = TimedOutputCheck(self.references, config, weight_dir, margin,
                                     CHECKED_ROWS["cuda" if is_cuda(self.device) else "cpu"])
            stage = "import"
            marks.append(("import", time.monotonic()))
            candidate = self.start(path, runners, deadline, self.home_cpus[0])
            if baseline is not None:
                # The baseline warms up (untimed) while the candidate goes through the gate.
                base = self.baseline(baseline, deadline)
                if not base.warm and is_cuda(self.device):  # a CPU has no idle cores to lend it
                    warming = self.background.submit(warm_up, base.driver, cases, raw_config, weight_dir)
            if level != "none":
                stage = "target"
                marks.append(("gate", time.monotonic()))
                result = gate.run_gate(candidate, self.references, config, weight_dir, seed, self.scratch,
                                       margin, level)
                verdict.update(worst_ratio=result.worst_ratio, worst_case=result.worst_case)
                if not result.passed:
                    verdict["case"] = result.case
                    return finish(verdict, started, "incorrect", result.stage, result.error)
            if bench != "none":
                stage = "timed"
                marks.append(("timing", time.monotonic()))
                contenders = [Contender("candidate", candidate)]
                check_warm_up(check, "candidate", warm_up(candidate, cases, raw_config, weight_dir))
                if baseline is not None:
                    if not base.warm:
                        runs = warming.result() if warming else warm_up(base.driver, cases, raw_config, weight_dir)
                        check_warm_up(check, "baseline", runs)
                        warming, self.kept.warm = None, True
                    contenders.append(Contender("baseline", self.kept.driver))
                self.spares.settle()
                self.time(verdict, contenders, cases, raw_config, weight_dir, check, min_rounds, max_rounds,
                          deadline, resolution, spent)
            return finish(verdict, started, "ok", "", "")
        except ConfigError as err:
            return finish(verdict, started, "invalid", "config", str(err))
        except gate.CorrectnessError as err:
            return finish(verdict, started, "incorrect", stage, str(err))
        except RunnerFailure as err:
            return finish(verdict, started, err.status, stage, str(err))
        except CandidateError as err:
            return finish(verdict, started, "crash", stage, str(err))
        except Exception as err:  # a runner's answer that broke our reading of it
            return finish(verdict, started, "crash", stage, error_text(err))
        finally:
            if warming is not None:  # the judgement ended before the baseline's warm-up was checked
                try:
                    check_warm_up(check, "baseline", warming.result())
                    self.kept.warm = True
                except Exception:
                    self.drop_kept()
            if verdict.get("status") in ("crash", "timeout") and stage == "timed":
                self.drop_kept()  # which of the two failed is not known: start the baseline afresh
            if self.kept is not None:
                self.kept.driver.process.pause()  # idle until the next judgement beside it
            for runner in runners:
                runner.close()
            verdict["phases"] = {**phases(marks, runners + ([base.driver.process] if base else [])), **spent}

    def start(self, path, runners: list, deadline: float, home_cpu=None) -> RunnerDriver:
        """A fresh runner with `path` imported."""
        process = self.spares.take()
        runners.append(process)
        driver = RunnerDriver(process, self.device, deadline, home_cpu, self.timing_cpu)
        driver.place(home_cpu)
        # One thread on a GPU: the runner is pinned to one core, where OpenMP threads
        # would only wait on each other (seen: 25 s judgements became 185 s).
        threads = 1 if is_cuda(self.device) else self.threads
        process.request("load", driver.left(), path=str(Path(path).resolve()), threads=threads)
        return driver

    def baseline(self, path: Path, deadline: float) -> "KeptRunner":
        """The baseline's runner: the one kept from the last judgement when it ran the same
        program (warm: imported, its warm-up engine made) and has not served too long."""
        key = (str(path), source_hash(path.read_text()))
        kept = self.kept
        if kept is not None and (kept.key != key or kept.uses >= KEPT_RUNNER_USES or not kept.warm
                                 or kept.driver.process.proc.poll() is not None):
            self.drop_kept()
        if self.kept is None:  # it outlives the judgement: not among the runners closed with it
            self.kept = KeptRunner(key, self.start(path, [], deadline, self.home_cpus[1 % len(self.home_cpus)]))
        self.kept.driver.process.resume()
        self.kept.driver.deadline = deadline
        self.kept.driver.process.spent.clear()  # this judgement's account starts now
        self.kept.uses += 1
        return self.kept

    def drop_kept(self) -> None:
        if self.kept is not None:
            self.kept.driver.process.close()
            self.kept = None

    def time(self, verdict, contenders, cases, raw_config, weight_dir, check, min_rounds, max_rounds,
             deadline, resolution, spent: dict) -> None:
        outcome = measure(contenders, cases, raw_config, weight_dir, self.device, check, min_rounds,
                          max_rounds, lambda: deadline - time.monotonic(), resolution)
        spent.update(timed_check=round(check.seconds, 3))
        candidate = contenders[0]
        tps = outcome.tokens_per_second(candidate)
        verdict.update(tokens_per_second=tps, rounds=outcome.rounds, fitness_cv=outcome.fitness_cv(candidate),
                       peak_memory_mb=candidate.peak_bytes / 2**20,
                       timings={name: candidate.seconds[name] for name in cases})
        if len(contenders) > 1:
            ratio, low, high = outcome.ratio()
            verdict.update(baseline_tokens_per_second=outcome.tokens_per_second(contenders[1]),
                           baseline_timings={name: contenders[1].seconds[name] for name in cases},
                           ratio=ratio, ratio_low=low, ratio_high=high)


@dataclass
class KeptRunner:
    key: tuple  # (path, source hash) of the program it runs
    driver: RunnerDriver
    uses: int = 0  # judgements it served
    warm: bool = False  # its warm-up ran and was checked


def phases(marks: list, runners: list) -> dict:
    """Seconds per stage of a judgement, and per request kind summed over its runners
    (prepare: making engines; go: the calls; fetch: the outputs' transfer)."""
    ends = [when for _, when in marks[1:]] + [time.monotonic()]
    spent = {stage: round(end - began, 3) for (stage, began), end in zip(marks, ends)}
    for runner in runners:
        for op, seconds in runner.spent.items():
            spent[f"runner_{op}"] = round(spent.get(f"runner_{op}", 0.0) + seconds, 3)
    return spent


def finish(verdict: dict, started: float, status: str, stage: str, error: str) -> dict:
    assert status in STATUSES, status
    verdict.update(status=status, stage=stage, error=error, seconds=round(time.monotonic() - started, 3))
    return verdict
