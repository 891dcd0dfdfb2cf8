"""The run's settings: one frozen object, validated with messages, defaults in one place.

Defaults that depend on the device (a CPU run must stay short, a GPU run judges every
case) are the two dicts below; everything else is a dataclass default. `RunConfig.build`
fills them in from the resolved device, then the object never changes.
"""
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from fitness.cases import CASE_SETS

REPO_ROOT = Path(__file__).resolve().parent.parent
SEED_ENGINE = REPO_ROOT / "seed_engine" / "engine.py"

# What a run on each kind of device gets unless told otherwise. Rounds: a program is
# timed beside its parent in interleaved rounds, at least `rounds` and, until the ratio
# between them is clear, at most `max_rounds` (fitness.timing); the final comparison with
# the seed takes up to `final_rounds`.
DEVICE_DEFAULTS = {
    # The public cases took ~40 s of a CPU judgement's ~70 on 2 cores: a CPU times the small ones.
    # 9m: the seed, the sweep and two more generations, and the final, on 2 cores (a 7m run
    # judged 10 programs over generations 0-2); run.sh stays under 10 minutes.
    "cpu": {"budget_s": 9 * 60, "population": 4, "workers": None, "bench": "small", "screen_bench": "small",
            "rounds": 2, "max_rounds": 3, "timeout_s": 300.0, "final_top": 1, "final_rounds": 6},
    "cuda": {"budget_s": 20 * 60, "population": 8, "workers": None, "bench": "all", "screen_bench": "public",
             "rounds": 3, "max_rounds": 5, "timeout_s": 600.0, "final_top": 2, "final_rounds": 12},
}
BENCH_CHOICES = CASE_SETS
MAX_CPU_WORKERS = 4
# A screen's comparison with the parent is clear once known to +-5% (the bandit's
# threshold for a gain: operators.IMPROVEMENT); a confirmation or the final to +-2%.
SCREEN_RESOLUTION, FULL_RESOLUTION = 0.05, 0.02
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


class SettingsError(ValueError):
    """A setting that cannot be run; the message says which and why."""


def parse_duration(text) -> float:
    """Seconds in "90", "90s", "10m", "1.5h"."""
    match = DURATION.match(str(text))
    if not match:
        raise SettingsError(f"a duration looks like 90s, 10m or 1h, got {text!r}")
    value, unit = match.groups()
    return float(value) * {"": 1, "s": 1, "m": 60, "h": 3600}[unit]


def format_duration(seconds: float) -> str:
    """"12m05s": how the console says the time left."""
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


@dataclass(frozen=True)
class RunConfig:
    model_config: Path
    weight_dir: Path
    device: str  # resolved: "cpu" or "cuda"
    budget_s: float  # wall clock for the whole run, final re-measure included
    population: int
    workers: int  # judgements at once: one per GPU, or CPU processes
    bench: str  # which throughput cases a full judgement times
    screen_bench: str  # ... and a screen
    rounds: int  # timed rounds at least, each program beside its parent
    max_rounds: int  # ... and at most, until the ratio between them is clear
    timeout_s: float  # per judgement
    final_top: int  # how many of the best are compared with the seed at the end
    final_rounds: int  # rounds at most of that comparison
    generations: int | None = None  # None: until the budget runs out
    seed_from: tuple = ()
    seed_from_top: int = 3  # programs taken from each earlier run or history
    # The library of recipes (evolve/library.py): the first generation takes its best for the
    # target, and the winner is added to library_dir (None: a folder `library` beside the history).
    library: bool = True
    library_dir: Path | None = None
    library_top: int = 4
    nsga2: bool = False  # peak memory as a second objective
    derived: bool = True  # judge on the derived configs too
    # The final times each case staged too (the evaluator's protocol: every input on the device
    # before the clock), and a contender replaces the floor only if not slower so (evolve.final).
    staged_final: bool = True
    # The gate's limit on the target weights, in the contract's tolerances (fitness.gate): a
    # deep fp16 model can round past 0.5 even in the seed
    # (docs/log/2026-11-23-rope-rows-swiglu-gate-at-1b-depth.md: 1.1-1.2 at 22 layers).
    margin: float = 0.5
    runs_dir: Path = Path("runs")
    workspace: Path = Path("workspace")
    history: Path = Path("history.csv")
    seed_engine: Path = SEED_ENGINE
    num_elite: int = 1  # the best programs carried over unchanged
    tournament_size: int = 3
    crossover_prob: float = 0.2
    rng_seed: int | None = None

    def __post_init__(self):
        for name in ("population", "workers", "rounds", "max_rounds", "final_top", "final_rounds",
                     "seed_from_top", "library_top", "num_elite", "tournament_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SettingsError(f"{name} must be a positive integer, got {value!r}")
        if self.generations is not None and self.generations < 1:
            raise SettingsError(f"generations must be at least 1, got {self.generations}")
        if self.max_rounds < self.rounds:
            raise SettingsError(f"max_rounds ({self.max_rounds}) must be at least rounds ({self.rounds})")
        if self.num_elite >= self.population:
            raise SettingsError(f"num_elite ({self.num_elite}) must be below population ({self.population})")
        if not self.budget_s > 0 or not self.timeout_s > 0:
            raise SettingsError(f"budget and timeout must be > 0, got {self.budget_s} and {self.timeout_s}")
        if self.device not in DEVICE_DEFAULTS:
            raise SettingsError(f"device must be one of {sorted(DEVICE_DEFAULTS)}, got {self.device!r}")
        for name in ("bench", "screen_bench"):
            if getattr(self, name) not in BENCH_CHOICES:
                raise SettingsError(f"{name} must be one of {BENCH_CHOICES}, got {getattr(self, name)!r}")
        if not self.margin > 0:
            raise SettingsError(f"margin must be > 0, got {self.margin}")
        if not 0.0 <= self.crossover_prob <= 1.0:
            raise SettingsError(f"crossover_prob must be within [0, 1], got {self.crossover_prob}")

    @classmethod
    def build(cls, device: str, **given) -> "RunConfig":
        """`given` over the device's defaults over the dataclass defaults."""
        if device not in DEVICE_DEFAULTS:
            raise SettingsError(f"device must be one of {sorted(DEVICE_DEFAULTS)}, got {device!r}")
        settings = {**DEVICE_DEFAULTS[device], **given, "device": device}
        if settings["workers"] is None:
            settings["workers"] = default_workers(device)
        unknown = set(settings) - {f.name for f in fields(cls)}
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        for name in ("model_config", "weight_dir", "runs_dir", "workspace", "history", "seed_engine", "library_dir"):
            if settings.get(name) is not None:
                settings[name] = Path(settings[name])
        if settings.get("library_dir") is None:
            settings["library_dir"] = Path(settings.get("history", cls.history)).parent / "library"
        settings["seed_from"] = tuple(Path(p) for p in settings.get("seed_from", ()))
        return cls(**settings)

    def to_dict(self) -> dict:
        """Plain values (paths as strings), for checkpoints and results.log."""
        return {k: (str(v) if isinstance(v, Path) else [str(p) for p in v] if k == "seed_from" else v)
                for k, v in asdict(self).items()}

    def judge_options(self, level: str, final: bool = False) -> dict:
        """What a judge is told about a judgement of this run at `level` ("screen" or
        "full"); without derived configs, a full judgement is a screen with all the cases."""
        return {"level": level if self.derived else "screen",
                "bench": self.bench if level == "full" else self.screen_bench,
                "margin": self.margin, "min_rounds": self.rounds,
                "max_rounds": self.final_rounds if final else self.max_rounds,
                "resolution": SCREEN_RESOLUTION if level == "screen" else FULL_RESOLUTION,
                "staged": final and self.staged_final}


def default_workers(device: str) -> int:
    """One judge per GPU; on a CPU one per core, up to MAX_CPU_WORKERS (each judge runs one
    thread: on a busy machine OpenMP threads waiting on each other made the gate 50x slower)."""
    if device == "cuda":
        return max(1, len(visible_gpus()))
    return max(1, min(MAX_CPU_WORKERS, len(os.sched_getaffinity(0))))


def visible_gpus() -> list[str]:
    """The GPU indices a worker may be pinned to (CUDA_VISIBLE_DEVICES entries)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed[:count] if listed else [str(i) for i in range(count)]
