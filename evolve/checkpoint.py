"""The run directory: each judged source under its id, the checkpoint, the winner.

    runs/<run_id>/candidates/<candidate_id>.py   every program judged in this run
    runs/<run_id>/checkpoint.pkl                 the state after the last whole generation
    runs/<run_id>/winner.py                      the final choice, once made

The checkpoint holds plain data only (sources, ids, numbers, RNG states), written to a
temporary file and renamed, so a kill at any moment leaves the previous one whole.
"""
import os
import pickle
import random
import time
from pathlib import Path

CHECKPOINT = "checkpoint.pkl"
FORMAT = 1


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + f"{random.SystemRandom().getrandbits(16):04x}"


class RunDir:
    def __init__(self, runs_dir, run_id: str, target: str):
        self.run_id, self.target = run_id, target
        self.path = Path(runs_dir) / run_id
        (self.path / "candidates").mkdir(parents=True, exist_ok=True)

    def candidate_path(self, program) -> Path:
        return self.path / "candidates" / f"{program.id}.py"

    def row_base(self, generation: int) -> dict:
        """The columns every history row of this run shares."""
        return {"run_id": self.run_id, "generation": generation, "target": self.target}

    def save(self, state: dict) -> Path:
        path = self.path / CHECKPOINT
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path


def load(run_dir) -> dict:
    """The last checkpoint of a run directory; a clear error when there is none."""
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint in {run_dir} (expected {path})")
    with open(path, "rb") as f:
        state = pickle.load(f)
    if state.get("format") != FORMAT:
        raise ValueError(f"{path} has checkpoint format {state.get('format')}, expected {FORMAT}")
    return state
