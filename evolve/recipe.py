"""A program's lineage as a recipe: the operator applications that make it from the seed.

`python -m evolve report HISTORY --recipe OUT.txt` writes the winner's. Each step of the
lineage (history.lineage: first parents, back to the seed) is one line, its args as
history.csv recorded them; a step with two parents (a crossover, a merge) becomes the allele
swaps, the rewrites (among those the history recorded anywhere: a merged gene may carry one)
and the constant settings that turn its first parent into the child
(mutations.recipe.crossover_steps), found by comparing the judged sources at
`source_path`. Every step is replayed as written and checked against the candidate id the
history recorded, so a recipe that is written reproduces the program exactly; when none
can be, LineageError says which step and why.
"""
import json
from pathlib import Path

import pandas as pd

import mutations
from contract.loader import source_hash
from evolve import history
from evolve.library import LIBRARY, steps_of
from evolve.stack import STACK
from mutations import program, recipe


class LineageError(ValueError):
    """The lineage cannot be written as a recipe; the message names the step."""


def lineage_recipe(frame: pd.DataFrame, candidate_id: str, history_path) -> str:
    """The text of a recipe that makes `candidate_id` from the seed."""
    steps = history.lineage(frame, candidate_id)
    if not steps:
        raise LineageError(f"{candidate_id} has no judged row in the history")
    source = program.SEED_PATH.read_text()
    lines = [f"# candidate {candidate_id}, made in {len(steps) - 1} steps from {steps[0]['operator']} ({Path(history_path).name})",
             f"#   python -m mutations recipe <this file> -o engine.py --check-hash {candidate_id}",
             "#   (the hash holds on the tree that judged it: an allele edited since makes another program)"]
    start = first_lines(steps[0], candidate_id)
    if start:  # the library's recipe the lineage starts from
        source = replayed(recipe.parse("\n".join(start)), source, 0, steps[0])
        lines += start
        lines[-1] += f"  # -> {steps[0]['candidate_id']}"
    for number, step in enumerate(steps[1:], start=1):
        made = recipe_steps(step, source, frame, history_path)
        source = replayed(made, source, number, step)
        if has_two_parents(step):
            parents = " and ".join(step["parent_ids"])
            lines.append(f"# {step['operator']} {step['candidate_id']} of {parents}, as swaps:")
        lines += [s.line() for s in made]
        lines[-1] += f"  # -> {step['candidate_id']}"
    return "\n".join(lines) + "\n"


def first_lines(first: dict, candidate_id: str) -> list:
    """The recipe lines of a lineage's first program: none for the seed; for a program of
    the library (evolve/library.py), or a --seed-from program a recipe also makes, its
    recipe's, as the history recorded them."""
    args = recorded_args(first["operator_args"]) if first["operator"] in (LIBRARY, "seed_from") else {}
    if first["operator"] == LIBRARY or "recipe" in args:
        return [f"# from the library: {Path(args.get('recipe', '?')).name}", *args.get("steps", [])]
    if first["operator"] != "seed" or first["candidate_id"] != source_hash(program.SEED_PATH.read_text()):
        raise LineageError(f"the lineage of {candidate_id} starts at {first['candidate_id']} ({first['operator']}), "
                           f"not at {program.SEED_PATH.name}: a recipe starts from the seed or the library")
    return []


def recipe_steps(step: dict, source: str, frame: pd.DataFrame, history_path) -> list:
    """The recipe lines of one lineage step applied to `source` (its first parent)."""
    if step["operator"] == STACK:  # its steps, as it recorded them
        return steps_of(recorded_args(step["operator_args"]))
    if not has_two_parents(step):
        return [recipe.RecipeStep(step["operator"], recorded_args(step["operator_args"]))]
    child = judged_source(frame, step["candidate_id"], history_path)
    made = recipe.crossover_steps(source, child, recorded_rewrites(frame))
    if isinstance(made, str):
        raise LineageError(f"the {step['operator']} that made {step['candidate_id']} cannot be written as "
                           f"allele swaps from its first parent: {made}")
    return made


def recorded_rewrites(frame: pd.DataFrame) -> list:
    """Every structural rewrite the history recorded, once each, as recipe steps (constants
    aside: crossover_steps sets those from the child)."""
    structural = {op.name for op in mutations.all_operators() if op.kind == "structural"} - {"tune_constant"}
    rows = frame[frame["operator"].isin(structural)]
    pairs = {(op, str(args)) for op, args in zip(rows["operator"], rows["operator_args"])}
    return [recipe.RecipeStep(op, recorded_args(args)) for op, args in sorted(pairs)]


def has_two_parents(step: dict) -> bool:
    """A crossover (or any step from two parents): a recipe holds it as swaps on the first."""
    return len(step["parent_ids"]) > 1


def replayed(steps: list, source: str, number: int, step: dict) -> str:
    """`source` after `steps`, checked to be the program the history recorded."""
    try:
        source = recipe.apply(steps, source)
    except recipe.RecipeError as err:
        raise LineageError(f"step {number} ({step['operator']}) does not replay: {err}") from None
    if source_hash(source) != step["candidate_id"]:
        raise LineageError(f"step {number} ({step['operator']}) replays to {source_hash(source)}, "
                           f"not {step['candidate_id']}")
    return source


def recorded_args(text: str) -> dict:
    return json.loads(text) if text and text not in ("nan", "{}") else {}


def judged_source(frame: pd.DataFrame, candidate_id: str, history_path) -> str:
    """The source judged as `candidate_id`, at its source_path (or beside the history,
    for a history moved with its runs directory)."""
    paths = frame.loc[frame["candidate_id"] == candidate_id, "source_path"]
    for path in map(Path, paths[paths != ""]):
        for where in (path, Path(history_path).parent / path):
            if where.is_file():
                return where.read_text()
    raise LineageError(f"no readable source for {candidate_id} (source_path {list(paths)[:1]})")
