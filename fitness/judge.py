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
from pathlib import Path

from fitness import gate
from fitness.candidate import CandidateError, RunnerFailure, Spares
from fitness.cases import CASE_SETS, select_cases
from fitness.devices import is_cuda, ramp_gpu_clocks
from fitness.loader import source_hash
from fitness.model_config import ConfigError, ModelConfig
from fitness.references import References
from fitness.runner import output_checksum
from fitness.timing import CHECKED_ROWS, RESOLUTION, Contender, TimedOutputCheck, measure
from fitness.verdict import STATUSES, error_text, new_verdict

LEVELS = ("none",) + gate.LEVELS
# Before each timed run: the engine was just built on the host with the GPU idle, and an
# idle H100 drops its clocks within milliseconds; every run starts from the same state.
CLOCK_BURST_S = 0.02
BENCH_CHOICES = ("none",) + CASE_SETS


class RunnerDriver:
    """Runs traces in a runner process; every run goes through `go`, timed or not."""

    def __init__(self, process, device: str, deadline: float):
        self.process, self.device, self.deadline = process, device, deadline
        self.last_seconds = 0.0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run_trace(self, config, weight_dir, events, seed: int, new_engine: bool = True,
                  keep_warm: bool = False, timed: bool = False) -> list:
        """One output per call (None for removes, a type name for a non-tensor answer).
        Every run is timed the same way; a `timed` one (a measurement) starts on a GPU
        whose clocks were just busy, as the ones before it did."""
        raw = config.to_dict() if isinstance(config, ModelConfig) else config
        self.process.request("prepare", self.left(), config=raw, weight_dir=str(weight_dir), device=self.device,
                             events=[event_fields(e) for e in events], seed=seed, keep_warm=keep_warm,
                             new_engine=new_engine)
        if timed:
            ramp_gpu_clocks(self.device, CLOCK_BURST_S)
        self.last_seconds, checksum = self.process.timed_go(self.left())
        _, outputs = self.process.request("fetch", self.left())
        if len(outputs) != len(events):
            raise gate.CorrectnessError(f"{len(outputs)} outputs for {len(events)} calls")
        if checksum != output_checksum(outputs):  # the runner's sum, recomputed on what it sent
            raise gate.CorrectnessError("the outputs fetched are not those the timed run answered for")
        return [None if e.kind == "remove" else out for e, out in zip(events, outputs)]

    def retained_bytes(self) -> int:
        header, _ = self.process.request("memory", self.left())
        return int(header["retained_bytes"])

    def peak_bytes(self) -> int:
        header, _ = self.process.request("memory", self.left())
        return int(header["peak_bytes"])


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

    def close(self) -> None:
        self.spares.close()

    def judge(self, path, config_path, weight_dir, seed: int, margin: float = gate.DEFAULT_MARGIN,
              level: str = "full", bench: str = "public", baseline=None, min_rounds: int = 3,
              max_rounds: int = 8, timeout: float = 600.0, resolution: float = RESOLUTION) -> dict:
        """The verdict on `path`; `baseline` (a program judged before) is timed beside it."""
        assert level in LEVELS and bench in BENCH_CHOICES, (level, bench)
        started, deadline = time.monotonic(), time.monotonic() + timeout
        weight_dir = Path(weight_dir).resolve()  # the runner works in a directory of its own
        baseline = Path(baseline).resolve() if baseline is not None else None
        verdict = new_verdict(path, self.device, seed)
        verdict["level"] = level
        runners, stage = [], "static"
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
            stage = "import"
            marks.append(("import", time.monotonic()))
            candidate = self.start(path, runners, deadline)
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
                if baseline is not None:
                    contenders.append(Contender("baseline", self.start(baseline, runners, deadline)))
                self.spares.settle()
                self.time(verdict, contenders, config, config_path, weight_dir, margin, bench,
                          min_rounds, max_rounds, deadline, resolution, spent)
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
            for runner in runners:
                runner.close()
            verdict["phases"] = {**phases(marks, runners), **spent}

    def start(self, path, runners: list, deadline: float) -> RunnerDriver:
        """A fresh runner with `path` imported."""
        process = self.spares.take()
        runners.append(process)
        if is_cuda(self.device):  # a host-bound engine on a core of its own: less jitter
            os.sched_setaffinity(process.proc.pid, {max(os.sched_getaffinity(0))})
        driver = RunnerDriver(process, self.device, deadline)
        # One thread on a GPU: the runner is pinned to one core, where OpenMP threads
        # would only wait on each other (seen: 25 s judgements became 185 s).
        threads = 1 if is_cuda(self.device) else self.threads
        process.request("load", driver.left(), path=str(Path(path).resolve()), threads=threads)
        return driver

    def time(self, verdict, contenders, config, config_path, weight_dir, margin, bench, min_rounds,
             max_rounds, deadline, resolution, spent: dict) -> None:
        raw_config = json.loads(Path(config_path).read_text())  # the engine gets the file as it is
        cases = select_cases(bench)
        check = TimedOutputCheck(self.references, config, weight_dir, margin,
                                 CHECKED_ROWS["cuda" if is_cuda(self.device) else "cpu"])
        outcome = measure(contenders, cases, raw_config, weight_dir, self.device, check, min_rounds,
                          max_rounds, lambda: deadline - time.monotonic(), resolution)
        spent.update(warmup=round(outcome.warmup_seconds, 3), timed_check=round(check.seconds, 3))
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
