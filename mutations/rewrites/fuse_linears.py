"""Fuse matmuls of one input by several weights of one dict into a single matmul.

In a top-level function, a statement holding two or more `x @ d["key"].T` with the same
name `x` and dict `d` becomes one `x @ fused_rows(d, keys).T`, split into the parts, which
the statement then uses. `fused_rows` stacks the weights' rows once, on the first call,
and leaves the separate weights behind as views of the stacked one, so no other gene
notices and no memory is added. Self-contained: it needs nothing of any other gene.
Declines when no statement has such a group (the seed's qkv_proj and mlp have one each;
fused alleles have none). Methods are not searched.
"""
import json
import random

import libcst as cst
import libcst.matchers as m

from mutations import program
from mutations.base import Applied, Declined, agrees
from mutations.rewrites import StructuralRewrite

DESCRIPTION = "fuse matmuls of one input by weights of one dict into one matmul by the stacked rows"

WEIGHT_MATMUL = m.BinaryOperation(
    left=m.Name(), operator=m.MatrixMultiply(),
    right=m.Attribute(value=m.Subscript(value=m.Name(), slice=[m.SubscriptElement(slice=m.Index(value=m.SimpleString()))]),
                      attr=m.Name("T")))

HELPERS = '''
def fused_rows(weights, keys):
    """The rows of weights[k] for k in keys as one matrix, stacked on first use; the parts
    become views of it, so whatever else reads them is unchanged and memory is not doubled."""
    name = "+".join(keys)
    if name not in weights:
        fused = torch.cat([weights[k] for k in keys])  # [sum of rows, in]
        for k, part in zip(keys, fused.split([weights[k].shape[0] for k in keys])):
            weights[k] = part
        weights[name] = fused
    return weights[name]
'''


def matmul_parts(node) -> tuple:
    """(input name, dict name, key) of an `x @ d["key"].T`."""
    subscript = node.right.value
    return node.left.value, subscript.value.value, subscript.slice[0].slice.value.evaluated_value


def candidates(module: cst.Module) -> list:
    """(function, statement index, input, dict, keys) of every fusable group, in source order."""
    found = []
    for stmt in module.body:
        if not isinstance(stmt, cst.FunctionDef) or not isinstance(stmt.body, cst.IndentedBlock):
            continue
        for i, line in enumerate(stmt.body.body):
            if not isinstance(line, cst.SimpleStatementLine):
                continue
            groups = {}
            if not any(isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply)
                       for node in program.walk(line)):
                continue  # most lines: m.findall's walk (in source order, as the keys must be) is slow
            for node in m.findall(line, WEIGHT_MATMUL):
                x, d, key = matmul_parts(node)
                keys = groups.setdefault((x, d), [])
                if key not in keys:
                    keys.append(key)
            found += [(stmt.name.value, i, x, d, tuple(keys)) for (x, d), keys in groups.items() if len(keys) > 1]
    return found


class UseParts(cst.CSTTransformer):
    """Each `x @ d["key"].T` of the group becomes the name of its part."""

    def __init__(self, x, d, names):
        self.x, self.d, self.names = x, d, names

    def leave_BinaryOperation(self, original_node, updated_node):
        if m.matches(original_node, WEIGHT_MATMUL):
            x, d, key = matmul_parts(original_node)
            if (x, d) == (self.x, self.d) and key in self.names:
                return cst.Name(self.names[key])
        return updated_node


class FuseLinearsOperator(StructuralRewrite):
    name = "fuse_linears"
    order = 1
    draws = True  # which group of matmuls
    devices = "any"
    description = DESCRIPTION
    declined_because = "no statement multiplies one input by two weights of one dict"
    find = staticmethod(candidates)

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        module = program.parse(source)
        found = candidates(module)
        return self.fuse(module, *found[rng.randrange(len(found))])

    def rewrite_as(self, source: str, args: dict) -> Applied | Declined:
        module = program.parse(source)
        for function, index, x, d, keys in candidates(module):
            if agrees({"function": function, "input": x, "weights": d, "keys": keys}, args):
                return self.fuse(module, function, index, x, d, keys)
        return Declined(self.name, f"no group of matmuls matches {json.dumps(args, sort_keys=True)}")

    def fuse(self, module: cst.Module, function: str, index: int, x: str, d: str, keys: tuple) -> Applied:
        body = list(module.body)
        at = next(i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == function)
        func = body[at]
        taken = program.names_used(func)
        names = {}
        for j, key in enumerate(keys):
            name = f"{key}_out" if key.isidentifier() else f"part{j}_out"
            while name in taken or name in names.values():
                name += "_"
            names[key] = name
        keys_code = "(" + ", ".join(repr(k) for k in keys) + ("," if len(keys) == 1 else "") + ")"
        sizes = ", ".join(f"{d}[{k!r}].shape[0]" for k in keys)
        fused = cst.parse_statement(
            f"{', '.join(names[k] for k in keys)} = ({x} @ fused_rows({d}, {keys_code}).T).split(({sizes}), dim=-1)\n")
        lines = list(func.body.body)
        target = lines[index]
        why = cst.EmptyLine(comment=cst.Comment(f"# One matmul by the stacked weights instead of {len(keys)}: "
                                                "one launch, one read of the input."))
        fused = fused.with_changes(leading_lines=[*target.leading_lines, why])
        lines[index:index + 1] = [fused, target.with_changes(leading_lines=[]).visit(UseParts(x, d, names))]
        body[at] = func.with_changes(body=func.body.with_changes(body=lines))
        module = module.with_changes(body=body)
        child = program.finish(module, [program.parse(HELPERS), program.seed_module()])
        return Applied(child, self.name, {"function": function, "input": x, "weights": d, "keys": list(keys)})
