"""What is known about each source judged so far: its measurements, and its fitness.

Keyed by candidate id (the hash of the source), so a program is judged once however
often it is bred, and across runs: `from_history` reloads the judgements of earlier
runs on the same target. A program's fitness is the mean over its measurements (first
judgement and re-timings), so one lucky timing fades as the elite is re-measured. A
program that ever failed a judgement stays failed: the gate's inputs are random, and a
program that fails once is not correct.
"""
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from evolve import history

FAILED_FITNESS = 0.0  # below every correct program: tokens/s are positive
FAILED_MEMORY_MB = 1e9  # the second objective's worst, finite so crowding distances stay numbers


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
                       config.derived], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class Score:
    is_ok: bool
    fitness: list = field(default_factory=list)  # one per ok judgement
    memory_mb: list = field(default_factory=list)
    source_path: str = ""
    judge_seconds: list = field(default_factory=list)
    tps: list = field(default_factory=list)  # {case: tokens/s} of each ok judgement

    def add(self, is_ok: bool, fitness: float, memory_mb, seconds, tps=None) -> None:
        self.is_ok = self.is_ok and is_ok
        if is_ok:
            self.fitness.append(fitness)
            self.memory_mb.append(finite_or_zero(memory_mb))
            self.tps.append(dict(tps or {}))
        if seconds is not None and math.isfinite(seconds):
            self.judge_seconds.append(float(seconds))


def finite_or_zero(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0


class Scores:
    def __init__(self):
        self.by_id: dict[str, Score] = {}

    def __contains__(self, candidate_id) -> bool:
        return candidate_id in self.by_id

    def add(self, candidate_id: str, status: str, fitness: float, memory_mb, seconds, source_path="",
            tps=None) -> None:
        score = self.by_id.setdefault(candidate_id, Score(is_ok=True, source_path=str(source_path)))
        score.add(status == "ok", fitness, memory_mb, seconds, tps)

    def is_ok(self, candidate_id: str) -> bool:
        score = self.by_id.get(candidate_id)
        return bool(score and score.is_ok and score.fitness)

    def values(self, candidate_id: str, nsga2: bool) -> tuple:
        """The DEAP fitness values of a judged program."""
        if not self.is_ok(candidate_id):
            return (FAILED_FITNESS, FAILED_MEMORY_MB) if nsga2 else (FAILED_FITNESS,)
        score = self.by_id[candidate_id]
        speed = sum(score.fitness) / len(score.fitness)
        return (speed, sum(score.memory_mb) / len(score.memory_mb)) if nsga2 else (speed,)

    def mean_tps(self, candidate_id: str) -> dict:
        """Tokens/s per case, averaged over the program's ok judgements."""
        runs = self.by_id[candidate_id].tps if candidate_id in self.by_id else []
        cases = [c for c in (runs[0] if runs else {}) if all(c in r for r in runs)]
        return {c: sum(r[c] for r in runs) / len(runs) for c in cases}

    def mean_judge_seconds(self, ok_only: bool = False, default: float = 30.0) -> float:
        times = [t for s in self.by_id.values() if s.is_ok or not ok_only for t in s.judge_seconds]
        return sum(times) / len(times) if times else default

    @classmethod
    def from_history(cls, path, target: str) -> "Scores":
        """The judgements of every earlier run on the same target."""
        scores = cls()
        if not Path(path).exists():
            return scores
        frame = history.read(path)
        if "target" not in frame.columns:
            return scores
        frame = frame[(frame["target"] == target) & frame["status"].isin(history.JUDGED_STATUSES)]
        tps_columns = [c for c in frame.columns if c.startswith("tps_")]
        for row in frame.to_dict("records"):
            tps = {c[len("tps_"):]: row[c] for c in tps_columns if finite_or_zero(row[c]) > 0}
            scores.add(row["candidate_id"], row["status"], row["fitness"], row["peak_memory_mb"],
                       row["judge_seconds"], row["source_path"], tps)
        return scores
