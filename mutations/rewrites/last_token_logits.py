"""Take logits of the last token only: index the hidden states before the final norm and
lm_head instead of indexing the logits after them.

Matches, in one block, `logits = rms_norm(x, ...) @ w` then `last = ...` (not using
logits) then `return logits[last]`, and rewrites them to `last = ...`,
`logits = rms_norm(x[last], ...) @ w`, `return logits`. Exact: rms_norm and the matmul
work row by row. Declines when no block has that shape (already rewritten, for one).
"""
import random

import libcst as cst
import libcst.matchers as m

from mutations import program
from mutations.base import Applied, Declined
from mutations.rewrites import StructuralRewrite

DESCRIPTION = "index the last token of each request before the final norm and lm_head, not after"
NORM_THEN_HEAD = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(target=m.Name())],
    value=m.BinaryOperation(operator=m.MatrixMultiply(), left=m.Call(func=m.Name("rms_norm"), args=[m.Arg(), m.ZeroOrMore()])))])
RETURN_INDEXED = m.SimpleStatementLine(body=[m.Return(value=m.Subscript(
    value=m.Name(), slice=[m.SubscriptElement(slice=m.Index(value=m.Name()))]))])
NAME_ASSIGN = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])


def match_block(lines) -> tuple | None:
    """(logits line, index line, return line) positions in a block, or None."""
    for i, line in enumerate(lines):
        if not m.matches(line, NORM_THEN_HEAD):
            continue
        logits = line.body[0].targets[0].target.value
        for j in range(i + 1, len(lines)):
            if m.matches(lines[j], RETURN_INDEXED) and lines[j].body[0].value.value.value == logits:
                index = lines[j].body[0].value.slice[0].slice.value.value
                between = range(i + 1, j)
                makers = [k for k in between if m.matches(lines[k], NAME_ASSIGN)
                          and lines[k].body[0].targets[0].target.value == index]
                if len(makers) != 1 or any(logits in program.names_used(lines[k]) for k in between):
                    break
                return i, makers[0], j
            if logits in program.names_used(lines[j]):
                break
    return None


class IndexFirst(cst.CSTTransformer):
    """Rewrites the first matching block."""

    def __init__(self):
        self.done = False

    def leave_IndentedBlock(self, original_node, updated_node):
        found = None if self.done else match_block(list(updated_node.body))
        if found is None:
            return updated_node
        self.done = True
        i, k, j = found
        lines = list(updated_node.body)
        line = lines[i]
        assign = line.body[0]
        index = lines[k].body[0].targets[0].target.value
        call = assign.value.left
        first = call.args[0].with_changes(value=cst.Subscript(value=call.args[0].value, slice=[
            cst.SubscriptElement(slice=cst.Index(value=cst.Name(index)))]))
        assign = assign.with_changes(value=assign.value.with_changes(left=call.with_changes(args=[first, *call.args[1:]])))
        comment = cst.Comment("# [B, vocab]: the norm and lm_head see each request's last token only")
        line = line.with_changes(body=[assign], trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "), comment=comment))
        ret = lines[j].with_changes(body=[cst.Return(value=cst.Name(assign.targets[0].target.value))])
        maker = lines[k]
        rest = [lines[x] for x in range(i + 1, j) if x != k]
        lines[i:j + 1] = [maker.with_changes(leading_lines=line.leading_lines), line.with_changes(leading_lines=[]), *rest, ret]
        return updated_node.with_changes(body=lines)


def has_match(module: cst.Module) -> bool:
    return any(match_block(list(node.body)) for node in program.walk(module) if isinstance(node, cst.IndentedBlock))


class LastTokenLogitsOperator(StructuralRewrite):
    name = "last_token_logits"
    order = 5
    devices = "any"
    description = DESCRIPTION
    declined_because = "no `logits = rms_norm(x, ...) @ w ... return logits[last]` block"
    find = staticmethod(has_match)

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        child = program.parse(source).visit(IndexFirst()).code
        return Applied(child, self.name, {})
