"""The run directory: each judged source under its id, the checkpoint, the winner.

    runs/<run_id>/candidates/<candidate_id>.py   every program judged in this run
    runs/<run_id>/checkpoint.pkl                 the state after the last whole generation
    runs/<run_id>/winner.py                      the final choice, once made

The checkpoint holds plain data only (sources, ids, numbers, RNG states), written to a
temporary file and renamed, so a kill at any moment leaves the previous one whole. It is read
back by an unpickler that makes nothing but that data (a candidate could write the file:
evolve.records), and held to what the run last wrote.
"""
import os
import pickle
import random
import time
from pathlib import Path

from evolve.records import Written

CHECKPOINT = "checkpoint.pkl"
FORMAT = 1


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + f"{random.SystemRandom().getrandbits(16):04x}"


class RunDir:
    def __init__(self, runs_dir, run_id: str, target: str):
        self.run_id, self.target = run_id, target
        self.path = Path(runs_dir) / run_id
        (self.path / "candidates").mkdir(parents=True, exist_ok=True)
        self.checkpoint = Written(self.path / CHECKPOINT)

    def candidate_path(self, program) -> Path:
        return self.path / "candidates" / f"{program.id}.py"

    def row_base(self, generation: int) -> dict:
        """The columns every history row of this run shares."""
        return {"run_id": self.run_id, "generation": generation, "target": self.target}

    def save(self, state: dict) -> Path:
        path = self.path / CHECKPOINT
        self.checkpoint.check()
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.checkpoint.wrote()
        return path


def load(run_dir) -> dict:
    """The last checkpoint of a run directory; a clear error when there is none."""
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint in {run_dir} (expected {path})")
    with open(path, "rb") as f:
        state = PlainData(f).load()
    if state.get("format") != FORMAT:
        raise ValueError(f"{path} has checkpoint format {state.get('format')}, expected {FORMAT}")
    return state


class PlainData(pickle.Unpickler):
    """Containers, strings and numbers, and numpy's scalars (the logbook's statistics): no
    other class or function is made, so a checkpoint a candidate wrote runs nothing."""
    ALLOWED = {("numpy", "dtype"), ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"a checkpoint holds plain data, not {module}.{name}")
        return super().find_class(module, name)
