"""Move a module constant within its declared range: halve or double it, or step it by one.

A tunable constant is a module-level integer assignment with a trailing range comment,
`SLAB_SLOTS = 16  # range: 4..256`; the comment (and anything after the range) is kept.
A count whose every value is worth a try (pipeline stages: 3 lies between 2 and 4) says
so, `# range: 1..4, step 1`, and moves by one instead; zero doubles to one.
Declines when the program declares no such constant, or none can move inside its range.
The seed declares none; alleles bring them: sizes (slots, pages, pool chunks, graph
batches and buckets, prefetch limits) and every kernel's launch parameters (blocks, warps,
stages, split counts), so the search tunes each per target.
Replayed from a recipe (`{"constant": NAME, "new": VALUE}`), it sets NAME to any VALUE in
its range. Extended (`extend`), it moves NAME once more the way it went: a search walks a
constant that gained, 1024 -> 2048 -> 4096, without drawing it from ~60 again. A constant
that bounds a call's size says which (`# range: 8..256, fits: decode_batch`), so that a run
can fit it to the calls it times (`fitted_to`).
"""
import random
import re

import libcst as cst
import libcst.matchers as m

from mutations import program
from mutations.base import Applied, Declined
from mutations.rewrites import StructuralRewrite

DESCRIPTION = "halve or double (or step by one) a module constant within its declared '# range: lo..hi'"
RANGE = re.compile(r"#\s*range:\s*(\d+)\s*\.\.\s*(\d+)")
STEP_ONE = re.compile(r"#\s*range:\s*\d+\s*\.\.\s*\d+\s*,\s*step 1\b")
FITS = re.compile(r"#\s*range:[^;]*fits:\s*(\w+)")
CONSTANT = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Integer())])


def declared(module: cst.Module) -> dict:
    """name -> (index in module body, (lo, hi)) of every constant with a declared range."""
    found = {}
    for i, stmt in enumerate(module.body):
        comment = getattr(stmt, "trailing_whitespace", None)
        comment = comment.comment if comment is not None else None
        if m.matches(stmt, CONSTANT) and comment is not None and RANGE.search(comment.value):
            lo, hi = map(int, RANGE.search(comment.value).groups())
            found[stmt.body[0].targets[0].target.value] = (i, (lo, hi))
    return found


def fitted_to(source: str, bounds: dict) -> list:
    """[{"constant", "new"}] raising each constant that fits a bound (`fits: NAME`, NAME a key
    of `bounds`) to the next power of two at or above it, inside its range; none lowered."""
    module = program.parse(source)
    moves = []
    for name, (i, (_, hi)) in declared(module).items():
        tag = FITS.search(module.body[i].trailing_whitespace.comment.value)
        value = module.body[i].body[0].value.evaluated_value
        if tag is not None and bounds.get(tag.group(1), 0) > value:
            new = min(hi, 1 << (bounds[tag.group(1)] - 1).bit_length())
            if new > value:
                moves.append({"constant": name, "new": new})
    return moves


def declared_values(module: cst.Module) -> dict:
    """name -> value of every constant with a declared range."""
    return {name: module.body[i].body[0].value.evaluated_value for name, (i, _) in declared(module).items()}


def steps_by_one(module: cst.Module, index: int) -> bool:
    return bool(STEP_ONE.search(module.body[index].trailing_whitespace.comment.value))


def neighbours(value: int, by_one: bool) -> tuple:
    """(the move down, the move up) from value."""
    return (value - 1, value + 1) if by_one else (value // 2, value * 2 if value else 1)


def tunable(module: cst.Module) -> list:
    """(index in module body, name, value, moves) of every constant that can move."""
    found = []
    for name, (i, (lo, hi)) in declared(module).items():
        value = module.body[i].body[0].value.evaluated_value
        moves = [v for v in neighbours(value, steps_by_one(module, i)) if lo <= v <= hi and v != value]
        if moves:
            found.append((i, name, value, moves))
    return found


class TuneConstantOperator(StructuralRewrite):
    name = "tune_constant"
    order = 3
    draws = True  # which constant, and which way
    # One draw is one of ~60 constants in the recipe's program: one a sweep tried 7 in three
    # 10-minute GPU runs, and 2 of those screened at 1.10x
    # (docs/log/2026-11-26-cpu-what-changed-step-time-norm-heads.md).
    sweep_places = 3
    needs_swap = "allele.KVCache.paged"  # the seed declares no constant; alleles bring them
    devices = "any"
    description = DESCRIPTION
    declined_because = "no module constant declares a range it can move in"
    find = staticmethod(tunable)

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        module = program.parse(source)
        index, _, _, moves = rng.choice(tunable(module))
        return self.set_constant(module, index, rng.choice(moves))

    def rewrite_as(self, source: str, args: dict) -> Applied | Declined:
        """Set args["constant"] to args["new"], any value inside its declared range: a
        recipe may set what a crossover took from another parent, not only a halving."""
        module = program.parse(source)
        found = declared(module).get(args.get("constant"))
        if found is None:
            return Declined(self.name, f"the program declares no tunable constant {args.get('constant')!r}")
        index, (lo, hi) = found
        new_value = args.get("new")
        if not isinstance(new_value, int) or not lo <= new_value <= hi:
            return Declined(self.name, f"{args['constant']} = {new_value!r} is outside its range {lo}..{hi}")
        return self.set_constant(module, index, new_value)

    def extend(self, source: str, args: dict) -> Applied | Declined:
        """args["constant"] moved from args["old"] to args["new"]: the same way once more."""
        old, new = args.get("old"), args.get("new")
        if not isinstance(old, int) or not isinstance(new, int) or old == new:
            return Declined(self.name, f"no move to go on with in {args}")

        def further():
            module = program.parse(source)
            found = declared(module).get(args.get("constant"))
            down, up = neighbours(new, found is not None and steps_by_one(module, found[0]))
            return self.rewrite_as(source, {"constant": args.get("constant"), "new": up if new > old else down})
        return self.guarded(source, further)

    def set_constant(self, module: cst.Module, index: int, new_value: int) -> Applied:
        stmt = module.body[index]
        name, value = stmt.body[0].targets[0].target.value, stmt.body[0].value.evaluated_value
        assign = stmt.body[0].with_changes(value=cst.Integer(str(new_value)))
        body = list(module.body)
        body[index] = stmt.with_changes(body=[assign])
        child = module.with_changes(body=body).code
        return Applied(child, self.name, {"constant": name, "old": value, "new": new_value})
