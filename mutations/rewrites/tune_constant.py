"""Move a module constant within its declared range: halve or double it.

A tunable constant is a module-level integer assignment with a trailing range comment,
`SLAB_SLOTS = 16  # range: 4..256`; the comment (and anything after the range) is kept.
Declines when the program declares no such constant, or none can halve or double inside
its range. The seed declares none; alleles bring them (slots, pages, splits, graph batch).
"""
import random
import re

import libcst as cst
import libcst.matchers as m

from mutations import program
from mutations.base import Applied, Declined
from mutations.rewrites import StructuralRewrite

DESCRIPTION = "halve or double a module constant within its declared '# range: lo..hi'"
RANGE = re.compile(r"#\s*range:\s*(\d+)\s*\.\.\s*(\d+)")
CONSTANT = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Integer())])


def tunable(module: cst.Module) -> list:
    """(index in module body, name, value, moves) of every constant that can move."""
    found = []
    for i, stmt in enumerate(module.body):
        comment = getattr(stmt, "trailing_whitespace", None)
        comment = comment.comment if comment is not None else None
        if not m.matches(stmt, CONSTANT) or comment is None or not RANGE.search(comment.value):
            continue
        lo, hi = map(int, RANGE.search(comment.value).groups())
        value = stmt.body[0].value.evaluated_value
        moves = [v for v in (value // 2, value * 2) if lo <= v <= hi and v != value]
        if moves:
            found.append((i, stmt.body[0].targets[0].target.value, value, moves))
    return found


class TuneConstantOperator(StructuralRewrite):
    name = "tune_constant"
    devices = "any"
    description = DESCRIPTION
    declined_because = "no module constant declares a range it can move in"
    find = staticmethod(tunable)

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        module = program.parse(source)
        index, name, value, moves = rng.choice(tunable(module))
        new_value = rng.choice(moves)
        stmt = module.body[index]
        assign = stmt.body[0].with_changes(value=cst.Integer(str(new_value)))
        body = list(module.body)
        body[index] = stmt.with_changes(body=[assign])
        child = module.with_changes(body=body).code
        return Applied(child, self.name, {"constant": name, "old": value, "new": new_value})
