"""What is known about each source judged so far: its measurements, and its fitness.

Keyed by candidate id (the hash of the source), so a program is judged once however
often it is bred, and across runs: `from_history` reloads the judgements of earlier
runs on the same target. A program that ever failed a judgement stays failed: the
gate's inputs are random, and a program that fails once is not correct.

Speed comes from two kinds of evidence. Paired comparisons (a program timed beside
another, interleaved, in one judge: fitness.timing) give the log of their speed ratio
with a small error, free of the drift between judgements; each program's own
measurements (geometric mean tokens/s) anchor the scale, with a larger error. A
program's fitness is the weighted least-squares fit of log speeds to all of it
(Bradley-Terry in spirit): a comparison moves both programs, and a program compared
with several others is placed by all of them.
"""
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evolve import history
from fitness.timing import t95

FAILED_FITNESS = 0.0  # below every correct program: tokens/s are positive
FAILED_MEMORY_MB = 1e9  # the second objective's worst, finite so crowding distances stay numbers
ABSOLUTE_SD = 0.15  # log-spread of one judgement's own tokens/s between judgements (GPU, eager engines)
MIN_PAIRED_SD = 0.01  # a paired ratio is never trusted to better than 1%
# A ratio far from 1 also drifts between judgements, which its own rounds cannot show: two
# programs that lean on the host unlike each other (a graph engine, an eager seed 14x slower)
# move apart with the host's state. Near 1 this adds nothing; far from it, ratios to the seed
# stop outweighing the paired comparisons of near-equal programs when the fit ranks them.
# Measured: one H100 run's ratios to the seed drifted 2-3% of their log
# (docs/log/2026-11-27-cpu-what-changed-fastest-always-judged.md).
DRIFT_PER_LOG_RATIO = 0.02


def geometric_mean_tps(verdict: dict) -> float:
    """The fitness of one judgement: the geometric mean of tokens/s over its cases."""
    values = list((verdict.get("tokens_per_second") or {}).values())
    if verdict.get("status") != "ok" or not values or min(values) <= 0:
        return FAILED_FITNESS
    return math.exp(sum(math.log(v) for v in values) / len(values))


def target_key(config) -> str:
    """Judgements are comparable only on the same model, weights, device and cases."""
    raw = json.loads(Path(config.model_config).read_text())
    text = json.dumps([raw, str(Path(config.weight_dir).resolve()), config.device, config.bench,
                       config.screen_bench, config.derived], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class Score:
    is_ok: bool
    fitness: list = field(default_factory=list)  # one per ok judgement
    memory_mb: list = field(default_factory=list)
    source_path: str = ""
    judge_seconds: list = field(default_factory=list)
    judge_levels: list = field(default_factory=list)  # the level of each of judge_seconds
    tps: list = field(default_factory=list)  # {case: tokens/s} of each ok judgement
    is_confirmed: bool = False  # passed a "full" judgement: derived configs and churn too

    def add(self, is_ok: bool, fitness: float, memory_mb, seconds, tps=None, level: str = "full") -> None:
        self.is_ok = self.is_ok and is_ok
        self.is_confirmed = self.is_ok and (self.is_confirmed or level == "full")
        if is_ok:
            self.fitness.append(fitness)
            self.memory_mb.append(finite_or_zero(memory_mb))
            self.tps.append(dict(tps or {}))
        if seconds is not None and math.isfinite(seconds):
            self.judge_seconds.append(float(seconds))
            self.judge_levels.append(level)


def finite_or_zero(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0


@dataclass(frozen=True)
class Comparison:
    """log(speed of a / speed of b) from one paired judgement, its standard error (its rounds'
    and the drift between judgements), and the interval's ends as the judge reported them."""
    a: str
    b: str
    log_ratio: float
    sd: float
    log_low: float
    log_high: float

    @classmethod
    def of(cls, a: str, b: str, ratio: float, low: float, high: float, rounds) -> "Comparison | None":
        """From a judgement's ratio and its ~95% interval over `rounds` (Student's t)."""
        values = (ratio, low, high, rounds)
        if not all(isinstance(v, (int, float)) and v > 0 and math.isfinite(v) for v in values) or rounds < 2:
            return None
        within = max(MIN_PAIRED_SD, math.log(high / low) / (2 * t95(int(rounds) - 1)))
        return cls(a, b, math.log(ratio), math.hypot(within, DRIFT_PER_LOG_RATIO * math.log(ratio)),
                   math.log(low), math.log(high))


class Scores:
    def __init__(self):
        self.by_id: dict[str, Score] = {}
        self.comparisons: list[Comparison] = []
        self.fitted = None  # id -> log speed, recomputed when evidence arrives

    def __contains__(self, candidate_id) -> bool:
        return candidate_id in self.by_id

    def add(self, candidate_id: str, status: str, fitness: float, memory_mb, seconds, source_path="",
            tps=None, level: str = "full") -> None:
        score = self.by_id.setdefault(candidate_id, Score(is_ok=True, source_path=str(source_path)))
        score.add(status == "ok", fitness, memory_mb, seconds, tps, level)
        self.fitted = None

    def compare(self, a: str, b: str, ratio, low, high, rounds) -> None:
        """Record a paired measurement: a ran `ratio` times as fast as b (interval low..high
        over `rounds` interleaved rounds)."""
        comparison = Comparison.of(a, b, ratio, low, high, rounds)
        if comparison is not None:
            self.comparisons.append(comparison)
            self.fitted = None

    def is_ok(self, candidate_id: str) -> bool:
        score = self.by_id.get(candidate_id)
        return bool(score and score.is_ok and score.fitness)

    def is_confirmed(self, candidate_id: str) -> bool:
        return self.is_ok(candidate_id) and self.by_id[candidate_id].is_confirmed

    def speed(self, candidate_id: str) -> float:
        """The fitted speed (geometric mean tokens/s) of a correct program."""
        if self.fitted is None:
            self.fitted = self.fit()
        return math.exp(self.fitted[candidate_id])

    def gain(self, child_id: str, parent_id: str) -> float | None:
        """Estimated speed ratio child / parent; None unless both are correct."""
        if not (self.is_ok(child_id) and self.is_ok(parent_id)):
            return None
        return self.speed(child_id) / self.speed(parent_id)

    def could_be_a_gain(self, child_id: str, parent_id: str) -> bool:
        """Whether the child may be faster than its parent: its fitted speed is higher, or a
        paired comparison of the two leaves a gain inside its ~95% interval. A gain of 1-5%
        reads anywhere from 0.95x to 1.05x in a screen's few rounds."""
        gain = self.gain(child_id, parent_id)
        if gain is None:
            return False
        return gain > 1.0 or any(self.upper_log_ratio(c, child_id, parent_id) > 0 for c in self.comparisons)

    def clearly_faster(self, a: str, b: str) -> bool:
        """Whether a paired comparison of a and b put a ahead, its whole ~95% interval above 1."""
        return any((c.log_low if c.a == a else -c.log_high) > 0 for c in self.comparisons if {c.a, c.b} == {a, b})

    def held_to(self, floor: str, ids: list) -> list:
        """Those of `ids` that may win against a floor other than the seed when no final compares
        them: the floor and the programs clearly faster beside it. A 5-minute H200 run whose
        final did not fit returned a library program fitted above the floor from a screen
        (1.012x) though its full judgement beside it was 0.985x; the evaluator had it at 0.92x
        on decode (docs/log/2026-11-29-floor-out-of-budget.md)."""
        return [i for i in ids if i == floor or self.clearly_faster(i, floor)]

    @staticmethod
    def upper_log_ratio(comparison: Comparison, a: str, b: str) -> float:
        """The top of log(speed a / speed b)'s interval by `comparison`; -inf when it compares others."""
        if {comparison.a, comparison.b} != {a, b}:
            return -math.inf
        return comparison.log_high if comparison.a == a else -comparison.log_low

    def fit(self) -> dict:
        """Weighted least squares: log speeds that best explain every comparison between
        correct programs and every program's own measurements."""
        ids = [cid for cid in self.by_id if self.is_ok(cid)]
        index = {cid: i for i, cid in enumerate(ids)}
        rows, targets, weights = [], [], []
        for cid in ids:
            for fitness in self.by_id[cid].fitness:
                rows.append({index[cid]: 1.0})
                targets.append(math.log(fitness))
                weights.append(1.0 / ABSOLUTE_SD)
        for c in self.comparisons:
            if c.a in index and c.b in index:
                rows.append({index[c.a]: 1.0, index[c.b]: -1.0})
                targets.append(c.log_ratio)
                weights.append(1.0 / c.sd)
        if not ids:
            return {}
        matrix = np.zeros((len(rows), len(ids)))
        for r, row in enumerate(rows):
            for col, value in row.items():
                matrix[r, col] = value * weights[r]
        solution = np.linalg.lstsq(matrix, np.array(targets) * np.array(weights), rcond=None)[0]
        return {cid: float(solution[index[cid]]) for cid in ids}

    def values(self, candidate_id: str, nsga2: bool) -> tuple:
        """The DEAP fitness values of a judged program."""
        if not self.is_ok(candidate_id):
            return (FAILED_FITNESS, FAILED_MEMORY_MB) if nsga2 else (FAILED_FITNESS,)
        score = self.by_id[candidate_id]
        speed = self.speed(candidate_id)
        return (speed, sum(score.memory_mb) / len(score.memory_mb)) if nsga2 else (speed,)

    def mean_tps(self, candidate_id: str) -> dict:
        """Tokens/s per case, averaged over the program's ok judgements."""
        runs = self.by_id[candidate_id].tps if candidate_id in self.by_id else []
        cases = [c for c in (runs[0] if runs else {}) if all(c in r for r in runs)]
        return {c: sum(r[c] for r in runs) / len(runs) for c in cases}

    def mean_judge_seconds(self, ok_only: bool = False, default: float = 30.0, level: str | None = None) -> float:
        """Mean seconds a judgement cost (its share of its batch), of one level or all."""
        times = [t for s in self.by_id.values() if s.is_ok or not ok_only
                 for t, lv in zip(s.judge_seconds, s.judge_levels) if level in (None, lv)]
        return sum(times) / len(times) if times else default

    @classmethod
    def from_history(cls, path, target: str) -> "Scores":
        """The judgements of every earlier run on the same target."""
        if not Path(path).exists():
            return cls()
        frame = history.read(path)
        if "target" not in frame.columns:
            return cls()
        return cls.from_frame(frame[frame["target"] == target])

    @classmethod
    def from_frame(cls, frame) -> "Scores":
        """The judgements in history rows (of one target)."""
        scores = cls()
        frame = frame[frame["status"].isin(history.JUDGED_STATUSES)]
        tps_columns = [c for c in frame.columns if c.startswith("tps_")]
        for row in frame.to_dict("records"):
            tps = {c[len("tps_"):]: row[c] for c in tps_columns if finite_or_zero(row[c]) > 0}
            scores.add(row["candidate_id"], row["status"], row["fitness"], row["peak_memory_mb"],
                       row["judge_seconds"], row["source_path"], tps, row.get("level") or "full")
            if row.get("baseline_id"):
                scores.compare(row["candidate_id"], row["baseline_id"], row.get("ratio"), row.get("ratio_low"),
                               row.get("ratio_high"), row.get("rounds"))
        return scores
