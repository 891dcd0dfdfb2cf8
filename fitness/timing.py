"""Timed runs of one or two programs, each in its own runner process, on the judge's clock.

The contract's protocol per program: one warm-up engine runs every case once and stays
alive; each timed run is a fresh engine from `create_engine`, timed from the judge's side
around the whole run (fitness.candidate.CandidateProcess.timed_run), every call's inputs
delivered when it is due. Two programs are
timed in rounds, interleaved: in each round every case runs once for each program, on the
same freshly drawn tokens, in alternating order, so drift, clocks and host noise fall on
both. Rounds go on until the ratio between them is clear (its ~95% interval excludes 1,
or is narrower than +-RESOLUTION), or `max_rounds`; a candidate far behind its baseline
(CLEAR_LOSS) in every round leaves after the first.

Every timed run draws fresh tokens, and rows of its outputs, picked at random after the
run, are compared with the reference here: a program that answers timed calls wrongly
(skipping work it guesses is not checked, or replaying outputs of earlier calls) is
incorrect, whatever its speed.
"""
import math
import random
import statistics
import time
from dataclasses import dataclass, field

from contract.devices import is_cuda
from fitness.gate import CorrectnessError, snapshot, tied_error
from fitness.traces import count_tokens

CLEAR_LOSS = 1 / 3  # a candidate this much slower than its baseline in every round so far leaves
                    # (after one round: the worst single run on a GPU was 1.5x its median)
RESOLUTION = 0.02  # a ratio is clear when its ~95% interval excludes 1, or is narrower than +-2%
                  # (a caller may accept a coarser one: a screen only needs to know a 5% gain)
# A program timed alone has no baseline to share its drift: its rounds go on until the
# standard error of its mean log fitness is under ALONE_ERROR and they have spanned
# ALONE_MIN_SPAN_S, up to ALONE_MAX_ROUNDS or ALONE_MAX_SPAN_S. On the GPU machines a
# host-bound engine's rounds vary by ~15% and a core's slow spells last seconds: 3 rounds
# left the seed's fitness at a CV of 17% from one judgement to the next, and two judgements
# of 3-4 steady rounds each drew 7,470 and 9,276 tokens/s
# (docs/log/2026-11-24-search-480ebbd-decode-kernel-costs.md). This repository's CPU machine
# has no such spells (a core's loop CV 3-5%), and its rounds are long: no span there.
ALONE_ERROR = 0.025
ALONE_MIN_SPAN_S = {"cuda": 10.0, "cpu": 0.0}
ALONE_MAX_SPAN_S = 20.0
ALONE_MAX_ROUNDS = 20
# Two-sided 95% quantiles of Student's t by degrees of freedom: with few rounds the spread
# is itself uncertain, and a normal quantile would call differences clear too soon.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
       12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def t95(dof: int) -> float:
    return T95[max(d for d in T95 if d <= dof)] if dof >= 1 else float("inf")


def t_cdf(x: float, dof: int, steps: int = 2000) -> float:
    """P(T <= x) for Student's t with `dof` degrees of freedom (Simpson's rule on its
    density: the standard library has no t distribution)."""
    norm = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)
    density = lambda u: norm * (1 + u * u / dof) ** (-(dof + 1) / 2)  # noqa: E731
    h = abs(x) / steps
    area = h / 3 * sum((1 if i in (0, steps) else 4 if i % 2 else 2) * density(i * h) for i in range(steps + 1))
    return 0.5 + math.copysign(area, x)
CHECKED_ROWS = {"cuda": 3, "cpu": 1}  # rows of each timed run compared with the reference
# A paired ratio counts a run slower than OUTLIER x the median of its contender's runs of the
# case as that median: the evaluator reports each case's median of three fresh engines, and on
# an H100 one mixed run in six took 3-7x its median, which moved a screen's mean of logs by
# 10% and ranked three library programs above fastest.txt's, 0.91-0.95x it by the evaluator
# (docs/log/2026-11-28-judge-vs-evaluator.md).
OUTLIER = 1.5


@dataclass
class Contender:
    name: str
    driver: object  # fitness.judge.RunnerDriver
    seconds: dict = field(default_factory=dict)  # case -> seconds of each timed run
    staged_seconds: dict = field(default_factory=dict)  # case -> seconds of each staged run (`measure`)
    peak_bytes: int = 0
    failure: Exception | None = None  # what ended its timing early (it is out of the comparison)

    @property
    def rounds(self) -> int:
        return min((len(times) for times in self.seconds.values()), default=0)

    def round_fitness(self, cases: dict, index: int) -> float:
        """Geometric mean tokens/s over the cases in round `index`."""
        logs = [math.log(sum(count_tokens(events)) / self.seconds[name][index]) for name, events in cases.items()]
        return math.exp(sum(logs) / len(logs))

    def tokens_per_second(self, cases: dict) -> dict:
        return {name: sum(count_tokens(events)) / statistics.median(self.seconds[name][:self.rounds])
                for name, events in cases.items()}

    def fitness_cv(self, cases: dict) -> float | None:
        values = [self.round_fitness(cases, i) for i in range(self.rounds)]
        return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else None


def held(seconds: list) -> list:
    """Each run's seconds, one slower than OUTLIER x the median of the runs as the median."""
    median = statistics.median(seconds)
    return [median if s > OUTLIER * median else s for s in seconds]


def ratio_interval(logs: list) -> tuple:
    """(the geometric mean of the ratios whose logs these are, low, high): a ~95% interval,
    Student's t over the rounds (unbounded with one)."""
    mean = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("inf")
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def is_decided(low: float, high: float, resolution: float = RESOLUTION) -> bool:
    """A ratio is known well enough: its interval excludes 1, or is within +-resolution."""
    return low > 1.0 or high < 1.0 or (high / low) ** 0.5 < 1.0 + resolution


@dataclass
class Outcome:
    """Candidates' comparisons with one baseline (or none: timed alone) over the same rounds."""
    baseline: Contender | None
    cases: dict
    rounds: int = 0

    def log_ratios(self, candidate: Contender, runs: str = "seconds") -> list:
        """Per round the candidate ran, the mean over cases of log(baseline's time / its time),
        a time past OUTLIER x its contender's median counted as the median (`held`); of its
        timed runs, or of its staged ones (`runs="staged_seconds"`)."""
        theirs, ours = ({c: held(times[c]) if times.get(c) else [] for c in self.cases}
                        for times in (getattr(self.baseline, runs), getattr(candidate, runs)))
        rounds = min(len(times) for times in ours.values())
        return [statistics.fmean(math.log(theirs[c][i] / ours[c][i]) for c in self.cases) for i in range(rounds)]

    def ratio(self, candidate: Contender) -> tuple:
        """(its speed over the baseline's, low, high) with a ~95% interval."""
        return ratio_interval(self.log_ratios(candidate))

    def staged_ratio(self, candidate: Contender) -> tuple | None:
        """`ratio` over the staged runs (the evaluator's protocol), or None without them."""
        logs = self.log_ratios(candidate, "staged_seconds") if self.baseline is not None else []
        return ratio_interval(logs) if logs else None

    def is_far_behind(self, candidate: Contender) -> bool:
        """Below CLEAR_LOSS of the baseline in every round so far: no more rounds are needed
        to call it a loss (a program at 0.15x made a CPU's batch of screens 3x as long)."""
        logs = self.log_ratios(candidate) if self.baseline is not None else []
        return bool(logs) and max(logs) < math.log(CLEAR_LOSS)

    def is_clear(self, candidate: Contender, resolution: float = RESOLUTION) -> bool:
        """Beside a baseline: the ratio is known well enough. Alone: `is_precise`."""
        if self.baseline is None:
            return self.is_precise(candidate)
        if candidate.rounds < 2:
            return False
        _, low, high = self.ratio(candidate)
        return is_decided(low, high, resolution)

    def is_precise(self, candidate: Contender) -> bool:
        """Timed alone: the standard error of its mean log fitness over rounds is under ALONE_ERROR."""
        logs = [math.log(candidate.round_fitness(self.cases, i)) for i in range(candidate.rounds)]
        return len(logs) >= 2 and statistics.stdev(logs) / math.sqrt(len(logs)) <= ALONE_ERROR


class TimedOutputCheck:
    """Compares rows of timed outputs, picked after each run, with the reference."""

    def __init__(self, references, config, weight_dir, margin: float, rows_per_run: int):
        self.references, self.config, self.weight_dir = references, config, weight_dir
        self.margin, self.rows_per_run = margin, rows_per_run
        self.pick = random.SystemRandom()  # nothing the candidate can seed or predict
        self.seconds = 0.0  # spent here, for the judgement's account of its time

    def __call__(self, outputs: list, events, seed: int, label: str) -> float:
        """The worst error of the picked rows; CorrectnessError past the margin."""
        started = time.monotonic()
        try:
            return self.check(outputs, events, seed, label)
        finally:
            self.seconds += time.monotonic() - started

    def check(self, outputs: list, events, seed: int, label: str) -> float:
        rows = [(i, r) for i, ev in enumerate(events) if ev.kind != "remove" for r in range(len(ev.request_ids))]
        picks = self.pick.sample(rows, min(self.rows_per_run, len(rows)))
        expected = self.references.rows(self.config, self.weight_dir, events, seed, picks)
        allowance = self.references.allowance(self.config, self.weight_dir)
        worst = 0.0
        for i, r in picks:
            where = f"{label}/{events[i].name or events[i].kind}#{i} row {r}"
            got = snapshot(outputs[i], where, (len(events[i].request_ids), self.config.vocab_size))
            ratio = tied_error(got[r], *expected[i, r]) / allowance
            if not ratio <= self.margin:
                raise CorrectnessError(f"{where}: a timed call's logits are off by {ratio:.3g} x tolerance "
                                       f"(limit {self.margin})")
            worst = max(worst, ratio)
        return worst


def fresh_seed() -> int:
    """A token seed nobody can predict (31 bits: every generator takes it)."""
    return random.SystemRandom().getrandbits(31)


def warm_up(driver, cases: dict, raw_config: dict, weight_dir) -> list:
    """The contract's warm-up: one engine runs every case once (untimed; it stays alive
    through the timed runs). (case, events, seed, outputs) of each, for check_warm_up."""
    runs = []
    for j, (name, events) in enumerate(cases.items()):
        seed = fresh_seed()
        runs.append((name, events, seed, driver.run_trace(raw_config, weight_dir, events, seed, new_engine=j == 0)))
    return runs


def check_warm_up(check: TimedOutputCheck, label: str, runs: list) -> None:
    for name, events, seed, outputs in runs:
        check(outputs, events, seed, f"{label}/warmup/{name}")


def measure(candidates: list, baseline, cases: dict, raw_config: dict, weight_dir, device: str,
            check: TimedOutputCheck, min_rounds: int, max_rounds: int, time_left,
            resolution: float = RESOLUTION, next_round=None, staged: bool = False) -> Outcome:
    """Interleaved rounds of warmed-up candidates and their baseline. A candidate leaves
    once its comparison with the baseline is clear (after `min_rounds`), or when it fails
    (its `failure`); the rounds end when none is left. Alone (no baseline), a candidate's
    rounds go on until its own fitness is precise (`Outcome.is_precise`) over at least
    ALONE_MIN_SPAN_S (on a GPU), up to the larger of `max_rounds` and ALONE_MAX_ROUNDS, or for
    ALONE_MAX_SPAN_S. In each case of a round each contender runs in turn on a fresh engine,
    alone on the judge's stage, as every run is (fitness.judge.RunnerDriver.go). A failure of
    the baseline ends them all. `next_round()`, when given, is called before each round (the
    judge moves its timing core). `staged`: each case of a round is run a second time by every
    contender, on fresh engines and tokens, staged: Outcome.staged_ratio."""
    outcome = Outcome(baseline, cases)
    runs = TimedRuns(baseline, raw_config, weight_dir, check, staged)
    ending = RoundsEnd(min_rounds, resolution, ALONE_MIN_SPAN_S["cuda" if is_cuda(device) else "cpu"])
    round_limit = max(max_rounds, ALONE_MAX_ROUNDS) if baseline is None else max_rounds
    active = list(candidates)
    round_seconds, first_round = 0.0, time.monotonic()
    while active and outcome.rounds < round_limit and (outcome.rounds == 0 or time_left() > 2 * round_seconds):
        started = time.monotonic()
        if next_round is not None:
            next_round()
        runs.round(round_order(active, baseline, outcome.rounds), cases)
        outcome.rounds += 1
        round_seconds, span = time.monotonic() - started, time.monotonic() - first_round
        active = [c for c in active if not ending.is_done(c, outcome, span)]
    return outcome


def round_order(active: list, baseline, index: int) -> list:
    """The contenders of round `index`, in order: each takes every place in turn."""
    everyone = active + ([baseline] if baseline else [])
    shift = index % len(everyone)
    return everyone[shift:] + everyone[:shift]


@dataclass(frozen=True)
class TimedRuns:
    """The timed runs of one measurement: a fresh engine each, its outputs checked."""
    baseline: Contender | None  # whose failure raises (`attempt`)
    raw_config: dict
    weight_dir: object
    check: TimedOutputCheck
    staged: bool = False  # each case run staged too (`measure`)

    def round(self, order: list, cases: dict) -> None:
        """Every case once for each contender in `order`; one that fails is out."""
        for name, events in cases.items():
            self.case(order, name, events)
            if self.staged:
                self.case(order, name, events, staged=True)
            order = [c for c in order if c.failure is None]

    def case(self, order: list, name: str, events, staged: bool = False) -> None:
        """Each contender's run of the case on a fresh engine, made right before it
        (RunnerDriver.go), then every run's outputs checked."""
        seed = fresh_seed()  # the same tokens for every contender in this round
        for contender in [c for c in order if c.failure is None]:
            seconds = attempt(contender, self.baseline, contender.driver.go, self.raw_config, self.weight_dir,
                              events, seed, staged=staged)
            if contender.failure is None:
                (contender.staged_seconds if staged else contender.seconds).setdefault(name, []).append(seconds)
        for contender in [c for c in order if c.failure is None]:
            self.fetch_and_check(contender, name, events, seed, "staged" if staged else "timed")

    def fetch_and_check(self, contender: Contender, name: str, events, seed: int, kind: str = "timed") -> None:
        outputs = attempt(contender, self.baseline, contender.driver.fetch, events)
        if contender.failure is None:
            if kind == "timed":  # a staged run holds every output to its end: not the engine's peak
                contender.peak_bytes = max(contender.peak_bytes, contender.driver.last_peak_bytes)
            attempt(contender, self.baseline, self.check_outputs, contender.driver, outputs, events, seed,
                    f"{contender.name}/{kind}/{name}")

    def check_outputs(self, driver, outputs: list, events, seed: int, label: str) -> float:
        """self.check, its error saying so where the outputs fetched share buffers (a staged run's)."""
        try:
            return self.check(outputs, events, seed, label)
        except CorrectnessError as err:
            if driver.last_shared_outputs:
                raise CorrectnessError(
                    f"{err}; {driver.last_shared_outputs} of the run's outputs share a buffer with an earlier call's: "
                    "a staged run holds every output to its end, so an engine whose next call overwrites what it "
                    "handed back fails here, though the contract allows it") from None
            raise


@dataclass(frozen=True)
class RoundsEnd:
    """When a contender's rounds end."""
    min_rounds: int
    resolution: float
    min_span: float  # alone: seconds its rounds must span (ALONE_MIN_SPAN_S)

    def is_done(self, contender: Contender, outcome: Outcome, span: float) -> bool:
        """Failed, far behind, or clear; alone, also after ALONE_MAX_SPAN_S."""
        alone = outcome.baseline is None
        if contender.failure is not None or outcome.is_far_behind(contender) or (alone and span >= ALONE_MAX_SPAN_S):
            return True
        settled = not alone or span >= self.min_span  # alone: over a slow spell of the host
        return settled and outcome.rounds >= self.min_rounds and outcome.is_clear(contender, self.resolution)


def attempt(contender: Contender, baseline, fn, *args, **kwargs):
    """fn(...), or None with the exception kept as the contender's `failure`. The
    baseline's failure is every candidate's: it raises."""
    if contender.failure is not None:
        return None
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        if contender is baseline:
            raise
        contender.failure = err
        return None
