"""The outputs, true at every moment: workspace/engine.py and workspace/results.log.

engine.py is replaced atomically (a temporary file, then a rename), so a reader or a
kill never sees half a program. results.log is appended and flushed line by line: the
settings, one line per generation, and at the end the winner against the seed and the
speed-of-light model, and its lineage.
"""
import os
import time
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Workspace:
    def __init__(self, root):
        self.root = Path(root)
        self.engine = self.root / "engine.py"
        self.log_path = self.root / "results.log"
        self.root.mkdir(parents=True, exist_ok=True)

    def put_engine(self, source: str) -> None:
        write_atomically(self.engine, source)

    def log(self, *lines: str) -> None:
        with open(self.log_path, "a") as f:
            for line in lines:
                f.write(line.rstrip("\n") + "\n")
            f.flush()

    def log_start(self, run_id: str, settings: dict, resumed_at: int | None) -> None:
        when = time.strftime("%Y-%m-%d %H:%M:%S")
        head = (f"== run {run_id} resumed at generation {resumed_at}, {when}" if resumed_at is not None
                else f"== run {run_id} started {when}")
        self.log(head, "settings: " + " ".join(f"{k}={v}" for k, v in settings.items()))

    def log_final(self, winner_id: str, table: list, lineage: list, ratio: float, how: str,
                  bounds: dict, gpu: str) -> None:
        """The winner per case against the seed and the roofline, and the operators that made it."""
        lines = [f"winner {winner_id}: {ratio:.3f}x the seed (geometric mean tokens/s; {how})",
                 f"{'case':<18}{'winner tok/s':>14}{'seed tok/s':>14}{'x seed':>8}"
                 f"{f'roofline tok/s ({gpu})':>26}{'of roofline':>13}"]
        for case, winner_tps, seed_tps in table:
            bound = bounds.get(case)
            of_bound = f"{winner_tps / bound:>12.2%}" if bound else f"{'-':>12}"
            suspect = "  ABOVE THE SPEED OF LIGHT: a bug until shown otherwise" if bound and winner_tps > bound else ""
            lines.append(f"{case:<18}{winner_tps:>14,.0f}{seed_tps:>14,.0f}{winner_tps / seed_tps:>8.2f}"
                         f"{(f'{bound:,.0f}' if bound else '-'):>26} {of_bound}{suspect}")
        lines.append("lineage: " + format_lineage(lineage))
        self.log(*lines)


def format_lineage(steps: list) -> str:
    """seed -> op(args) -> op(args) ..."""
    if not steps:
        return "(unknown)"
    parts = []
    for step in steps:
        args = step["operator_args"]
        parts.append(f"{step['operator']}({args})" if args not in ("", "{}", "nan") else step["operator"])
    return " -> ".join(parts) + f"  [{steps[-1]['candidate_id']}]"


def roofline_tps(config) -> tuple[dict, str]:
    """Speed-of-light tokens/s per case, and the GPU they assume; empty when unavailable."""
    try:
        from fitness import roofline
        from fitness.cases import select_cases
        from fitness.model_config import ModelConfig

        gpu = roofline.gpu_for_device(config.device)
        model = ModelConfig.load(config.model_config)
        cases = select_cases(config.bench)
        return {name: roofline.case_bound(model, events, gpu)["tokens_per_second"]
                for name, events in cases.items()}, gpu
    except Exception:  # the roofline is another module's, and only informative here
        return {}, "n/a"
