"""Hoist table building out of the per-call path: build a row-wise gene's table once in
`__init__`, for every position, and gather its rows per call.

A row-wise gene maps each entry of its first argument (positions) to table rows on its
own; `rope_tables` is one by its contract ("cos and sin [N, head_dim/2] for absolute
positions [N]"). In a class whose `__init__` takes `model_config`, a call of such a gene
outside `__init__` whose other arguments are all `self.` attributes becomes a gather from
tables built after `__init__` has set those attributes, over max_position_embeddings
positions. Values are bit-identical: each row is the same fp32 computation. Declines when
no such call remains (already hoisted, or an engine that builds its tables itself).
"""
import json
import random

import libcst as cst
import libcst.matchers as m

from mutations import program
from mutations.base import Applied, Declined, agrees
from mutations.rewrites import StructuralRewrite

DESCRIPTION = "build rope_tables once in __init__ for every position and gather rows per call"
ROWWISE_GENES = {"rope_tables": ("cos", "sin")}  # gene -> names of the tables it returns
SELF_ATTRIBUTE = m.Arg(value=m.Attribute(value=m.Name("self")), keyword=None)


def rowwise_call(node) -> bool:
    return m.matches(node, m.Call(func=m.Name(m.MatchIfTrue(lambda n: n in ROWWISE_GENES)))) \
        and len(node.args) > 1 and node.args[0].keyword is None \
        and all(m.matches(a, SELF_ATTRIBUTE) for a in node.args[1:])


def init_of(cls: cst.ClassDef):
    return next((s for s in cls.body.body if m.matches(s, m.FunctionDef(name=m.Name("__init__")))
                 and any(p.name.value == "model_config" for p in s.params.params)), None)


def candidates(module: cst.Module) -> list:
    """(class name, gene) pairs with a hoistable call, in source order."""
    found = []
    for stmt in module.body:
        if not isinstance(stmt, cst.ClassDef) or init_of(stmt) is None:
            continue
        for method in stmt.body.body:
            if isinstance(method, cst.FunctionDef) and method.name.value != "__init__":
                for call in m.findall(method, m.Call()):
                    if rowwise_call(call) and (stmt.name.value, call.func.value) not in found:
                        found.append((stmt.name.value, call.func.value))
    return found


class GatherRows(cst.CSTTransformer):
    """Each call of `gene` becomes a tuple of row gathers from the hoisted tables."""

    def __init__(self, gene):
        self.gene = gene

    def leave_Call(self, original_node, updated_node):
        if rowwise_call(original_node) and original_node.func.value == self.gene:
            index = program.code(updated_node.args[0].value)
            parts = ", ".join(f"self.{self.gene}_{t}[{index}]" for t in ROWWISE_GENES[self.gene])
            return cst.parse_expression(f"({parts})")
        return updated_node


def sets_attribute(stmt, names) -> bool:
    targets = m.findall(stmt, m.AssignTarget(target=m.Attribute(value=m.Name("self"))))
    targets += m.findall(stmt, m.Element(value=m.Attribute(value=m.Name("self"))))
    return any(program.code(t.target if isinstance(t, cst.AssignTarget) else t.value).split(".")[1] in names
               for t in targets)


class HoistTablesOperator(StructuralRewrite):
    name = "hoist_tables"
    order = 4
    draws = True  # which class and gene
    devices = "any"
    description = DESCRIPTION
    declined_because = "no per-call table building by a row-wise gene with self arguments"
    find = staticmethod(candidates)

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        module = program.parse(source)
        return self.hoist(module, *rng.choice(candidates(module)))

    def rewrite_as(self, source: str, args: dict) -> Applied | Declined:
        module = program.parse(source)
        for cls_name, gene in candidates(module):
            if agrees({"class": cls_name, "gene": gene}, args):
                return self.hoist(module, cls_name, gene)
        return Declined(self.name, f"no per-call table building matches {json.dumps(args, sort_keys=True)}")

    def hoist(self, module: cst.Module, cls_name: str, gene: str) -> Applied:
        cls = program.definitions(module)[cls_name]
        init = init_of(cls)
        call = next(c for meth in cls.body.body if isinstance(meth, cst.FunctionDef) and meth.name.value != "__init__"
                    for c in m.findall(meth, m.Call()) if rowwise_call(c) and c.func.value == gene)
        args = ", ".join(program.code(a.value) for a in call.args[1:])
        needed = {"device"} | {program.code(a.value).split(".")[1] for a in call.args[1:]}
        tables = ", ".join(f"self.{gene}_{t}" for t in ROWWISE_GENES[gene])
        build = cst.parse_statement(
            f"{tables} = {gene}(torch.arange(int(model_config.get('max_position_embeddings') or 4096), "
            f"device=self.device), {args})\n")
        build = build.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
            f"# {gene} for every position, built once: each call gathers its rows instead."))])
        lines = list(init.body.body)
        after = max((i for i, s in enumerate(lines) if sets_attribute(s, needed)), default=len(lines) - 1)
        lines.insert(after + 1, build)
        new_init = init.with_changes(body=init.body.with_changes(body=lines))
        methods = [new_init if meth is init else meth.visit(GatherRows(gene)) if isinstance(meth, cst.FunctionDef)
                   else meth for meth in cls.body.body]
        new_cls = cls.with_changes(body=cls.body.with_changes(body=methods))
        module = program.replace_gene(module, cls_name, new_cls)
        child = program.finish(module, [program.seed_module()])
        return Applied(child, self.name, {"class": cls_name, "gene": gene})
