"""An engine program as top-level units: genes, helpers, imports, and the edits on them.

A gene is a top-level def or class with a name in `GENES`. The allele it carries is
recorded in the program itself, as a comment directly above the definition:

    # allele: slab
    class KVCache:

A gene without the comment carries the "seed" allele. The comment is part of the node's
leading lines, so it travels with the definition through every libcst rewrite and through
crossover. Every other top-level def, class or assignment is a helper: it is carried along
when a gene that names it is, pruned once nothing names it, and placed right before the
first statement that names it, so one program is written one way however it was made.
"""
import ast
import dataclasses
import io
import re
import sys
import tokenize
from functools import lru_cache
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from contract.loader import SEED_ENGINE

GENES = ("compute_dtype", "load_weights", "rms_norm", "add_rms_norm", "rope_frequencies", "rope_tables",
         "apply_rope", "qkv_proj", "add_qkv_bias", "norm_qkv", "norm_heads", "attention_inputs", "mlp",
         "route", "dispatch", "experts_swiglu", "combine", "sorted_experts", "moe", "plus_shared_expert", "norm_mlp",
         "KVCache", "attend_prefill", "attend_decode", "attention", "Engine", "create_engine", "RecurrentState",
         "delta_net_decode", "delta_net_prefill", "delta_gates", "gated_rms_norm", "prompt_convs", "chunk_systems")
SEED_ALLELE = "seed"
SEED_PATH = SEED_ENGINE
MARKER = re.compile(r"#\s*allele:\s*([A-Za-z0-9_]+)\s*$")
FSTRING = re.compile(r"[rRbB]?[fF][rR]?['\"]")
# Passes of ensure_defined (one helper or import added each) and prune (one dropped each):
# far more than any program has helpers; a bound, so that a cycle ends (ensure_defined raises).
MAX_HELPER_PASSES = 100


class ProgramError(ValueError):
    """Source that is not an engine in gene form; the message says why."""


@lru_cache(maxsize=256)
def parse(source: str) -> cst.Module:
    """The libcst module of `source` (cached: modules are immutable, and every operator's
    precondition parses the same program)."""
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as err:
        raise ProgramError(f"does not parse: {str(err).splitlines()[0]}") from None


def seed_module() -> cst.Module:
    return parse(SEED_PATH.read_text())


# --- what a top-level statement is ---------------------------------------------------------

def defined_name(stmt) -> str | None:
    """The name a top-level def, class or single-name assignment binds, else None."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return stmt.name.value
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None  # isinstance, not matchers: asked of every statement, many times a swap
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return small.targets[0].target.value
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
        return small.target.value
    return None


@lru_cache(maxsize=8192)  # by node identity, as names_used: missing_names asks it of every
def is_import(stmt) -> bool:  # statement for every name, most of a swap's time uncached
    return m.matches(stmt, m.SimpleStatementLine(body=[m.OneOf(m.Import(), m.ImportFrom())]))


def is_docstring(stmt) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())]))


def import_bindings(stmt) -> set:
    """Names a top-level import statement binds (`import a.b` binds `a`)."""
    node, names = stmt.body[0], set()
    if isinstance(node.names, cst.ImportStar):
        return names
    for alias in node.names:
        if alias.asname is not None:
            names.add(alias.asname.name.value)
        elif isinstance(node, cst.Import):
            names.add(cst.Module([]).code_for_node(alias.name).split(".")[0])
        else:
            names.add(alias.name.value)
    return names


@lru_cache(maxsize=8192)
def names_in_order(node) -> tuple:
    """Every identifier a node mentions (locals and keywords included: a cheap, safe
    over-estimate), each once, in the order they first appear. Read from the node's code's
    tokens, which is what libcst's Name nodes are, in the same order, at a third of the cost
    of visiting them. Cached by node identity: libcst nodes are immutable."""
    names = {}  # an ordered set
    for token in tokenize.generate_tokens(io.StringIO(code(node)).readline):
        if token.type == tokenize.NAME:
            names.setdefault(token.string)
        elif token.type == tokenize.STRING and FSTRING.match(token.string):
            for name in fstring_names(token.string):  # one token before Python 3.12
                names.setdefault(name)
    return tuple(names)


def walk(node):
    """Every node under `node` (itself included), in no promised order: a read-only walk of
    the nodes' fields, where libcst's visitors and matchers rebuild every node they pass
    (a second or more on a 2,000-line program). For questions of existence; where the
    source order matters, m.findall."""
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        for name in child_fields(type(node)):
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(v for v in value if isinstance(v, cst.CSTNode))


@lru_cache(maxsize=None)
def child_fields(node_type) -> tuple:
    return tuple(f.name for f in dataclasses.fields(node_type))


def fstring_names(literal: str) -> list:
    """The names an f-string's fields mention, in order."""
    found = []
    for n in ast.walk(ast.parse(literal, mode="eval")):
        if isinstance(n, ast.Name):
            found.append((n.lineno, n.col_offset, n.id))
        elif isinstance(n, ast.Attribute):
            found.append((n.end_lineno, n.end_col_offset - len(n.attr), n.attr))
        elif isinstance(n, ast.Constant) and any(n.value is v for v in (True, False, None)):
            found.append((n.lineno, n.col_offset, repr(n.value)))  # libcst's Names
        elif isinstance(n, (ast.keyword, ast.arg)) and (n.arg is not None):
            found.append((n.lineno, n.col_offset, n.arg))
    return [name for *_, name in sorted(found)]


@lru_cache(maxsize=8192)
def names_used(node) -> frozenset:
    """names_in_order as a set."""
    return frozenset(names_in_order(node))


@lru_cache(maxsize=512)
def definitions(module: cst.Module) -> dict:
    """name -> top-level statement defining it (the last one wins, as in Python).
    Cached by module identity; callers must not change the dict."""
    return {defined_name(s): s for s in module.body if defined_name(s)}


@lru_cache(maxsize=512)
def imports_by_name(module: cst.Module) -> dict:
    """name -> the first top-level import binding it. Cached by module identity, as
    definitions: missing_names asks it of every name a program mentions, locals included."""
    found = {}
    for stmt in module.body:
        if is_import(stmt):
            for name in import_bindings(stmt):
                found.setdefault(name, stmt)
    return found


def code(node) -> str:
    return cst.Module([]).code_for_node(node)


# --- alleles ----------------------------------------------------------------------------

def allele_of(stmt) -> str:
    for line in getattr(stmt, "leading_lines", ()):
        if line.comment is not None:
            found = MARKER.match(line.comment.value)
            if found:
                return found.group(1)
    return SEED_ALLELE


def gene_alleles(module: cst.Module) -> dict:
    """gene -> allele name, for every gene the program defines."""
    defs = definitions(module)
    return {g: allele_of(defs[g]) for g in GENES if g in defs}


def with_leading(stmt, allele: str | None, blank_lines: int):
    """`stmt` with `blank_lines` blank lines above it, its own comments kept, and the
    allele marker (when `allele` is not None and not the seed) directly above it."""
    comments = [line for line in stmt.leading_lines
                if line.comment is not None and not MARKER.match(line.comment.value)]
    lines = [cst.EmptyLine()] * blank_lines + comments
    if allele is not None and allele != SEED_ALLELE:
        lines.append(cst.EmptyLine(comment=cst.Comment(f"# allele: {allele}")))
    return stmt.with_changes(leading_lines=lines)


def blank_lines_for(stmt) -> int:
    return 2 if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else 1


# --- edits -------------------------------------------------------------------------------

def replace_gene(module: cst.Module, gene: str, new_stmt) -> cst.Module:
    """`module` with the definition of `gene` replaced by `new_stmt` (marker included)."""
    body = list(module.body)
    for i, stmt in enumerate(body):
        if defined_name(stmt) == gene:
            body[i] = new_stmt
            return module.with_changes(body=body)
    insert_at = next((i for i, s in enumerate(body) if defined_name(s) == "create_engine"), len(body))
    body.insert(insert_at, new_stmt)
    return module.with_changes(body=body)


def add_imports(module: cst.Module, imports: list) -> cst.Module:
    """Add each import statement not already present (compared as code) after the last import."""
    body = list(module.body)
    present = {code(s).strip() for s in body if is_import(s)}
    last = max((i for i, s in enumerate(body) if is_import(s)), default=0)
    for stmt in imports:
        text = code(stmt.with_changes(leading_lines=[])).strip()
        if text not in present:
            last += 1
            body.insert(last, stmt.with_changes(leading_lines=[]))
            present.add(text)
    return module.with_changes(body=body)


def missing_names(module: cst.Module, sources: list) -> list:
    """(name, statement, source) for names the module uses but does not bind, found as a
    top-level definition or import in one of `sources` (first one wins)."""
    bound = set(definitions(module))
    for stmt in module.body:
        if is_import(stmt):
            bound |= import_bindings(stmt)
    used = set()
    for stmt in module.body:
        if not is_import(stmt):
            used |= names_used(stmt)
    found = []
    for name in sorted(used - bound):
        for source in sources:
            stmt = definitions(source).get(name)
            if stmt is not None and name not in GENES:
                found.append((name, stmt, "def"))
                break
            imp = imports_by_name(source).get(name)
            if imp is not None:
                found.append((name, imp, "import"))
                break
    return found


def ensure_defined(module: cst.Module, sources: list) -> cst.Module:
    """Pull every helper and import the program names but lacks from `sources`, in order of
    preference; each helper goes right before the first statement that names it."""
    for _ in range(MAX_HELPER_PASSES):
        missing = missing_names(module, sources)
        if not missing:
            return module
        name, stmt, kind = missing[0]
        if kind == "import":
            module = add_imports(module, [stmt])
            continue
        body = list(module.body)
        first_user = next(i for i, s in enumerate(body) if not is_import(s) and name in names_used(s))
        body.insert(first_user, with_leading(stmt, None, blank_lines_for(stmt)))
        module = module.with_changes(body=body)
    raise ProgramError("helpers do not settle")


def prune(module: cst.Module) -> cst.Module:
    """Drop helpers and imports nothing else names; genes, create_engine, the docstring and
    `from __future__` stay."""
    for _ in range(MAX_HELPER_PASSES):
        body = list(module.body)
        uses = [names_used(s) if not is_import(s) else set() for s in body]
        dead = None
        for i, stmt in enumerate(body):
            if is_docstring(stmt) or m.matches(stmt, m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))])):
                continue
            names = import_bindings(stmt) if is_import(stmt) else {defined_name(stmt)} - {None}
            if not names or names & set(GENES):
                continue
            if not any(names & uses[j] for j in range(len(body)) if j != i):
                dead = i
                break
        if dead is None:
            return module
        del body[dead]
        module = module.with_changes(body=body)
    return module


def imported_module(stmt) -> str:
    """The dotted module an import statement names first (`from a.b import c`: a.b)."""
    node = stmt.body[0]
    if isinstance(node, cst.ImportFrom):
        return "." * len(node.relative) + (code(node.module) if node.module else "")
    return code(node.names[0].name)


def import_order(stmt) -> tuple:
    """`from __future__` first, then the standard library, then the rest; by module within."""
    name = imported_module(stmt)
    group = 0 if name == "__future__" else 1 if name.split(".")[0] in sys.stdlib_module_names else 2
    return group, name, code(stmt.with_changes(leading_lines=[])).strip()


def ordered_imports(module: cst.Module) -> cst.Module:
    """The imports heading the module (after its docstring) in one order, a blank line between
    groups: two programs with the same imports then read the same, whichever operators added
    them in which order (a recipe replays a crossover's child exactly only so)."""
    body = list(module.body)
    start = 1 if body and is_docstring(body[0]) else 0
    end = start
    while end < len(body) and is_import(body[end]):
        end += 1
    head = sorted(body[start:end], key=import_order)
    if head == body[start:end]:
        return module
    first_lines = body[start].leading_lines
    groups = [import_order(stmt)[0] for stmt in head]
    for i, stmt in enumerate(head):
        comments = [line for line in stmt.leading_lines if line.comment is not None]
        if i == 0:
            lines = list(first_lines) + comments
        else:
            lines = [cst.EmptyLine()] * (groups[i] != groups[i - 1]) + comments
        head[i] = stmt.with_changes(leading_lines=lines)
    return module.with_changes(body=body[:start] + head + body[end:])


def ordered_helpers(module: cst.Module) -> cst.Module:
    """Every helper right before the first statement that names it, the helpers it names
    before it (in the order their names first appear): where a helper sits then follows from
    the program's code, not from which operator brought it when (a recipe replays a merge's
    child exactly only so). Genes and other statements keep their order; a module defining
    a helper name twice is left as it is."""
    body = list(module.body)
    helpers = {}
    for stmt in body:
        name = defined_name(stmt)  # None for imports and the docstring
        if name is not None and name not in GENES:
            if name in helpers:
                return module
            helpers[name] = stmt
    ordered, placed = [], set()

    def place_helpers_of(stmt):
        for name in names_in_order(stmt):
            if name in helpers and name not in placed:
                placed.add(name)
                place_helpers_of(helpers[name])
                ordered.append(with_leading(helpers[name], None, blank_lines_for(helpers[name])))

    for stmt in body:
        if defined_name(stmt) not in helpers:
            if not is_import(stmt) and not is_docstring(stmt):
                place_helpers_of(stmt)
            ordered.append(stmt)
    ordered += [with_leading(stmt, None, blank_lines_for(stmt)) for name, stmt in helpers.items()
                if name not in placed]  # named by no other statement: only each other
    return module.with_changes(body=ordered)


def finish(module: cst.Module, sources: list) -> str:
    """Source of `module` once its missing helpers are pulled in, dead ones pruned, and its
    helpers and imports ordered."""
    module = ordered_imports(ordered_helpers(prune(ensure_defined(module, sources))))
    source = module.code
    parse(source)
    return source
