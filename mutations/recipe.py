"""Recipes: a program written as the operator applications that make it from the seed.

One application per line, as history.csv names it: the operator's name, then (optional)
its args as one JSON object, `tune_constant {"constant": "PAGE_SIZE", "new": 32}`. `#`
starts a comment; blank lines are ignored. Each line is replayed (`Operator.replay`): the
recorded choice, never a random one, so a recipe makes the same source every time. A line
that declines is an error naming it, never skipped.

A recipe is linear and crossover has two parents, so a crossover step is written as the
allele swaps, then the rewrites, then the constant settings that turn its first parent into
the child (`crossover_steps`), when some do.
"""
import difflib
import json
from dataclasses import dataclass, field
from functools import lru_cache

import mutations
from mutations import program
from mutations.base import Applied, Declined
from mutations.rewrites.tune_constant import declared_values


class RecipeError(ValueError):
    """A recipe line that does not parse or does not apply; the message names the line."""


@dataclass(frozen=True)
class RecipeStep:
    operator: str
    args: dict = field(default_factory=dict)
    line_no: int = 0  # where it was read, 0 when it was made

    def line(self) -> str:
        return f"{self.operator} {json.dumps(self.args, sort_keys=True)}" if self.args else self.operator


def parse(text: str) -> list[RecipeStep]:
    steps = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            steps.append(parse_line(line, line_no))
    return steps


def parse_line(line: str, line_no: int) -> RecipeStep:
    """`OPERATOR`, `OPERATOR {json args}`, either with a trailing `# comment`."""
    operator, _, rest = line.partition(" ")
    rest, args = rest.strip(), {}
    if rest.startswith("{"):
        try:
            args, end = json.JSONDecoder().raw_decode(rest)
        except json.JSONDecodeError as err:
            raise RecipeError(f"line {line_no}: the args of {operator} are not JSON: {err}") from None
        rest = rest[end:].strip()
    if rest and not rest.startswith("#"):
        raise RecipeError(f"line {line_no}: expected `{operator} {{json args}}`, found {rest[:40]!r} after the name")
    return RecipeStep(operator, args, line_no)


def apply_step(source: str, step: RecipeStep) -> Applied | Declined:
    return replayed(source, step.operator, json.dumps(step.args, sort_keys=True))


# A replay is a pure function of the source and the step, and recipes share their first steps
# (every library program starts as fastest.txt's does): a process replays each pair once.
@lru_cache(maxsize=512)
def replayed(source: str, operator: str, args: str) -> Applied | Declined:
    step = RecipeStep(operator, json.loads(args))
    if step.operator == "crossover":
        return Declined(step.operator, "a recipe is linear and crossover has two parents: write the allele "
                                       "swaps it made (`python -m evolve report --recipe` does)")
    try:
        operator = mutations.get_operator(step.operator)
    except KeyError as err:
        return Declined(step.operator, err.args[0])
    return operator.replay(source, step.args)


def apply(steps: list[RecipeStep], source: str | None = None, log=None) -> str:
    """The program the steps make from `source` (the seed when None); RecipeError names the
    first line that declines."""
    source = program.SEED_PATH.read_text() if source is None else source
    for step in steps:
        result = apply_step(source, step)
        if isinstance(result, Declined):
            where = f"line {step.line_no}: " if step.line_no else ""
            raise RecipeError(f"{where}{step.operator} declined: {result.reason}")
        if log:
            log(f"line {step.line_no}: {RecipeStep(result.operator, result.args).line()}")
        source = result.source
    return source


# --- a crossover as swaps ----------------------------------------------------------------------

def crossover_steps(parent: str, child: str, rewrites=()) -> list[RecipeStep] | str:
    """The allele swaps, then rewrites of `rewrites` (Steps, as recorded where the donor was
    made), then the constant settings that turn `parent` (a crossover's first parent) into
    `child` exactly; or why they do not. A gene the donor got from a structural rewrite
    (last_token_logits on its Engine) still names its allele, so a swap alone brings the
    allele's code, not the rewritten one. Where helpers and imports sit follows from a
    program's code (program.finish orders them), so a merge that took a gene away and back
    needs no swap for the trip."""
    wanted = program.gene_alleles(program.parse(child))
    made = swaps_to(parent, child, wanted)
    if isinstance(made, str):
        return made
    source, steps = made
    source, rewritten = rewrites_to(source, child, rewrites)
    source, tuned = constants_to(source, child)
    if isinstance(tuned, str):
        return tuned
    if source == child:
        return steps + rewritten + tuned
    return "swaps give every gene its allele, yet the program differs from the child " \
           f"({first_difference(source, child)})"


def swaps_to(source: str, child: str, wanted: dict) -> tuple | str:
    """(program, steps): `source` once swaps give every gene its `wanted` allele; or why they
    cannot."""
    steps = []
    while missing := unmatched(source, wanted):
        found = closer_swap(source, wanted, len(missing))
        if found is None:
            return f"no allele swap brings {', '.join(f'{g}={wanted[g]}' for g in missing)} closer"
        source, step = found
        steps.append(step)
    return source, steps


def rewrites_to(source: str, child: str, rewrites) -> tuple:
    """(program, steps): `source` after each of `rewrites` that brings it closer to the
    child (`distance`), tried in turn until none does; a rewrite whose recorded choices
    `source` does not offer is tried with its own."""
    steps, distance = [], program_distance(source, child)
    while distance[0]:
        for step in rewrites:
            result = apply_step(source, step)
            if isinstance(result, Declined) and step.args:  # its choices as made on another program
                result = apply_step(source, RecipeStep(step.operator, {}))  # (programmatic_launch's kernels)
            closer = program_distance(result.source, child) if isinstance(result, Applied) else distance
            if closer < distance:
                source, distance = result.source, closer
                steps.append(RecipeStep(result.operator, result.args))
                break
        else:
            break
    return source, steps


def program_distance(source: str, child: str) -> tuple:
    """(top-level definitions whose code differs, lines that differ) between the two,
    compared in that order: two rewrites of one gene (last_token_logits, then
    prefetched_linears on Engine) each leave the gene different, and only the lines tell
    that the first brought it closer."""
    ours, theirs = (program.definitions(program.parse(s)) for s in (source, child))
    genes = sum(1 for g in set(ours) | set(theirs) if g not in ours or g not in theirs
                or program.code(ours[g]) != program.code(theirs[g]))
    lines = difflib.SequenceMatcher(None, source.splitlines(), child.splitlines(), autojunk=False)
    return genes, sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in lines.get_opcodes() if tag != "equal")


def constants_to(source: str, child: str) -> tuple:
    """(program, steps): `source` once its declared constants take the child's values; the
    steps are why not when one cannot."""
    steps = []
    for name, value in declared_values(program.parse(child)).items():
        if declared_values(program.parse(source)).get(name) != value:
            result = apply_step(source, RecipeStep("tune_constant", {"constant": name, "new": value}))
            if isinstance(result, Declined):
                return source, f"cannot set {name} = {value}: {result.reason}"
            source = result.source
            steps.append(RecipeStep(result.operator, result.args))
    return source, steps


def unmatched(source: str, wanted: dict) -> list:
    """Genes of `wanted` whose allele in `source` is another, in gene order."""
    carried = program.gene_alleles(program.parse(source))
    return [g for g in wanted if carried.get(g) != wanted[g]]


def closer_swap(source: str, wanted: dict, num_unmatched: int):
    """(new source, step) of the first swap, in gene order, that leaves fewer genes
    unmatched (a swap may repair other genes, so not every one does)."""
    for gene in unmatched(source, wanted):
        result = apply_step(source, RecipeStep(f"allele.{gene}.{wanted[gene]}"))
        if isinstance(result, Applied) and len(unmatched(result.source, wanted)) < num_unmatched:
            return result.source, RecipeStep(result.operator, result.args)
    return None


def first_difference(a: str, b: str) -> str:
    for line_no, (x, y) in enumerate(zip(a.splitlines(), b.splitlines()), start=1):
        if x != y:
            return f"line {line_no}: {x.strip()[:60]!r} where the child has {y.strip()[:60]!r}"
    return f"{len(a.splitlines())} lines against the child's {len(b.splitlines())}"
