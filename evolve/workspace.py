"""The outputs, true at every moment: workspace/engine.py and workspace/results.log.

engine.py is replaced atomically (a temporary file, then a rename), so a reader or a
kill never sees half a program. It opens with a header (`with_header`, in place of the
seed's docstring) naming its run, its lineage from the seed, its tokens/s against the
seed's and the device. results.log is appended and flushed line by line: the settings,
one line per generation, and at the end the winner against the seed, against the
speed-of-light model on a GPU, and its lineage.
"""
import json
import math
import os
import re
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
import libcst.matchers as m
import torch

from contract.devices import is_cuda
from contract.loader import source_hash
from contract.model_config import ModelConfig
from evolve.library import LIBRARY, steps_of
from evolve.stack import STACK
from fitness import roofline
from fitness.cases import select_cases


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class Roofline:
    """Speed-of-light tokens/s per case on `gpu`; without bounds, `missing` says why."""
    bounds: dict
    gpu: str = ""
    missing: str = ""


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
                  bounds: Roofline) -> None:
        """The winner per case against the seed and the roofline, and the operators that made it."""
        lines = [f"winner {winner_id}: {times_the_seed(ratio)} (geometric mean tokens/s; {how})",
                 *case_table(table, bounds)]
        if not bounds.bounds:
            lines.append(f"roofline: {bounds.missing}")
        lines.append("lineage: " + format_lineage(lineage))
        self.log(*lines)


def times_the_seed(ratio: float) -> str:
    """"1.234x the seed", or why there is no ratio (a budget that ended before the seed's judgement)."""
    return "not compared with the seed (not judged)" if math.isnan(ratio) else f"{ratio:.3f}x the seed"


def case_table(table: list, bounds: Roofline | None = None) -> list[str]:
    """Lines of a per-case table: tokens/s against the seed's, and against the speed of
    light when there are bounds (a result above it is flagged: a bug until shown otherwise)."""
    bounds = bounds or Roofline({})
    with_bounds = bool(bounds.bounds)
    head = f"{'case':<18}{'tok/s':>14}{'seed tok/s':>14}{'x seed':>8}"
    lines = [head + (f"{f'roofline tok/s ({bounds.gpu})':>26}{'of roofline':>13}" if with_bounds else "")]
    for case, tps, seed_tps in table:
        line = f"{case:<18}{tps:>14,.0f}{seed_tps:>14,.0f}{tps / seed_tps:>8.2f}"
        if with_bounds:
            bound = bounds.bounds.get(case)
            of_bound = f"{tps / bound:>12.2%}" if bound else f"{'-':>12}"
            suspect = "  ABOVE THE SPEED OF LIGHT: a bug until shown otherwise" if bound and tps > bound else ""
            line += f"{(f'{bound:,.0f}' if bound else '-'):>26} {of_bound}{suspect}"
        lines.append(line)
    return lines


def describe_step(step: dict) -> str:
    """One lineage step: the operator and its args; a crossover by its other parent and
    the genes it took from it (its args name every gene and the parent it came from); a
    program of the library by its recipe's file; a stack by its operators (the recipe written
    from the history has their args)."""
    args = step["operator_args"]
    if step["operator"] == LIBRARY:  # its recipe by name: the steps are in the file
        return f"{LIBRARY}({Path(json.loads(args).get('recipe', '?')).name})"
    if step["operator"] == STACK:
        return f"{STACK}({', '.join(s.operator for s in steps_of(json.loads(args)))})"
    if len(step["parent_ids"]) > 1:
        genes = json.loads(args).get("genes", {}) if args not in ("", "nan") else {}
        taken = [gene for gene, parent in genes.items() if parent == "b"]
        return f"{step['operator']} with {step['parent_ids'][1]} (its {', '.join(taken) or 'genes'})"
    return f"{step['operator']}({args})" if args not in ("", "{}", "nan") else step["operator"]


def format_lineage(steps: list) -> str:
    """seed -> op(args) -> op(args) ..."""
    if not steps:
        return "(unknown)"
    return " -> ".join(describe_step(step) for step in steps) + f"  [{steps[-1]['candidate_id']}]"


def roofline_tps(config) -> Roofline:
    """Speed-of-light tokens/s per case on the run's GPU; none on a CPU (the model is of
    a GPU's memory bandwidth and tensor cores)."""
    if not is_cuda(config.device):
        return Roofline({}, missing=f"none for a {config.device} run: the speed-of-light model is for GPUs")
    try:
        gpu = roofline.gpu_for_device(config.device)
        model = ModelConfig.load(config.model_config)
        return Roofline({name: roofline.case_bound(model, events, gpu)["tokens_per_second"]
                         for name, events in select_cases(config.bench).items()}, gpu)
    except Exception as err:  # informative only: the run's result stands without it
        return Roofline({}, missing=f"unavailable ({type(err).__name__}: {err})")


def device_label(device: str) -> str:
    """The device programs were judged on, by the GPU's name where there is one. Asked
    only after the judging: the search process itself leaves the GPU alone."""
    if is_cuda(device) and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(0)})"
    return f"{device} ({os.cpu_count()} cores)" if device == "cpu" else device


# --- the header of workspace/engine.py -----------------------------------------------------

def with_header(source: str, run_id: str, lineage_steps: list, table: list, device: str, note: str) -> str:
    """`source` with its module docstring (or none) replaced by a header that says what it
    is: its run, lineage, figures against the seed, and device. The code is untouched."""
    text = header_text(source_hash(source), run_id, lineage_steps, table, device, note)
    docstring = cst.Expr(cst.SimpleString('"""' + docstring_body(text) + '"""'))
    module = cst.parse_module(source)
    body = list(module.body)
    if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])):
        body[0] = body[0].with_changes(body=[docstring])
    else:
        body.insert(0, cst.SimpleStatementLine(body=[docstring]))
    return module.with_changes(body=body).code


def docstring_body(text: str) -> str:
    """`text` as the inside of a triple-quoted literal: backslashes kept, no run of quotes
    that could close it."""
    return re.sub(r'(?<=")"', r'\\"', text.replace("\\", "\\\\"))


def header_text(candidate_id: str, run_id: str, steps: list, table: list, device: str, note: str) -> str:
    lines = [f"Engine {candidate_id}, evolved by engine-evolver in run {run_id}.", "",
             *textwrap.wrap(f"{note}.", width=88), f"Judged on {device}.", "", "Lineage, from seed_engine/engine.py:"]
    lines += [f"  {describe_step(step)}" for step in steps] or ["  (not in the history)"]
    lines += ["", "Tokens/s against the seed:", *(f"  {line}" for line in case_table(table))] if table \
        else ["", "No tokens/s against the seed: the seed has no correct judgement to compare with."]
    lines += ["", "Genes are as in seed_engine/engine.py; `# allele: NAME` above one names its allele."]
    return "\n".join(lines) + "\n"
