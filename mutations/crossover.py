"""Crossover: a child taking each gene from either parent, closed under declared requirements.

Two ways to say which parent gives each gene, one way to build the child:
- `crossover(a, b, rng)`: each gene both parents define comes from a or b with probability
  1/2 (uniform crossover over genes);
- `merge_gains(a, b, base, rng, genes)`: the child is `a` with every gene in which `b`
  differs from `base` (their common ancestor) taken from `b`, or only those of `genes`, so
  two gains made apart are combined; it draws nothing from the rng. `intended_genes` says
  which genes an operator meant to change (not those its requirements dragged along).

Requirements are then settled by pulling genes from the parent that has what is needed: for
a violation (gene G, from parent p, needs gene H in a set of alleles), H is taken from
whichever parent carries an allele every gene of the child allows, preferring p; when
neither does, from the library (fused q/k/v from one parent and SwiGLU over fused gate/up
from the other need load_weights' fused_both, which neither carries: two H100 searches'
winners each kept one half); failing that, from the parent that carries an allowed allele;
failing that, G is taken from the other parent. Each gene is moved once at most, so this
ends; if it cannot settle, or the child is a copy of a parent, the operator declines. The
child brings each gene's helpers and imports from the parent that gave the gene (then from
the seed), and drops what nothing uses.
"""
import random

from mutations import alleles, program, requirements
from mutations.base import Applied, Declined
from mutations.rewrites import programmatic_launch

NAME = "crossover"
MERGE_NAME = "merge_gains"
LIBRARY = "library"  # where a gene comes from when neither parent carries what the child needs


def crossover(a: str, b: str, rng: random.Random) -> Applied | Declined:
    try:
        parents = {"a": program.parse(a), "b": program.parse(b)}
    except program.ProgramError as err:
        return Declined(NAME, str(err))
    defs = {p: program.definitions(mod) for p, mod in parents.items()}
    genes = shared_genes(parents)
    if all(program.code(defs["a"][g]) == program.code(defs["b"][g]) for g in genes):
        return Declined(NAME, "the parents carry the same genes")
    origin = {g: "a" if rng.random() < 0.5 else "b" for g in genes}
    return settled_child(NAME, parents, (a, b), origin)


def merge_gains(a: str, b: str, base: str, rng: random.Random, genes=None, b_whole=False) -> Applied | Declined:
    """`a` with the genes `b` changed since `base` (those of them in `genes`, if given) taken
    from `b`; rng unused (deterministic). A child that is `b` itself (its requirements took
    back every gene of `a`'s) declines, unless `b_whole`: folding many gains into one child,
    a stronger gain may displace a weaker one whole (fused weights over fused linears)."""
    try:
        parents = {"a": program.parse(a), "b": program.parse(b)}
        ancestor = program.definitions(program.parse(base))
    except program.ProgramError as err:
        return Declined(MERGE_NAME, str(err))
    defs_b = program.definitions(parents["b"])
    shared = shared_genes(parents)
    changed = {g for g in shared if g not in ancestor or gene_key(defs_b[g]) != gene_key(ancestor[g])}
    if genes is not None:
        changed &= set(genes)
    if not changed:
        return Declined(MERGE_NAME, "b carries no gene that differs from the base")
    origin = {g: "b" if g in changed else "a" for g in shared}
    return settled_child(MERGE_NAME, parents, (a, b), origin, copies_of=("b",) if b_whole else ())


def intended_genes(child: str, parent: str, args: dict) -> set:
    """The genes an operator meant to change in making `child` from `parent`: those that
    differ, less the ones its requirements repaired (`args["repairs"]`). A merge of every
    gain takes only these: a cache a swap dragged along is not a gain of its own."""
    try:
        before, after = program.definitions(program.parse(parent)), program.definitions(program.parse(child))
    except program.ProgramError:
        return set()
    differ = {g for g in program.GENES if g in after and (g not in before or gene_key(after[g]) != gene_key(before[g]))}
    return differ - set((args or {}).get("repairs") or {})


def shared_genes(parents: dict) -> list:
    """The genes both parents define, in gene order."""
    carried = [program.gene_alleles(mod) for mod in parents.values()]
    return [g for g in program.GENES if all(g in c for c in carried)]


def gene_key(stmt) -> tuple:
    """What a gene is, blank lines and comments above it aside: its allele and its code."""
    return program.allele_of(stmt), program.code(stmt.with_changes(leading_lines=[]))


def settled_child(name: str, parents: dict, sources: tuple, origin: dict, copies_of=()) -> Applied | Declined:
    """The child taking each gene from the parent `origin` names, once requirements are
    settled (`origin` is repaired in place); Declined when they cannot settle or the child
    is a copy of a parent (but of those in `copies_of`)."""
    carried = {p: program.gene_alleles(mod) for p, mod in parents.items()}
    carried[LIBRARY] = {}
    repairs = settle(origin, carried)
    if isinstance(repairs, str):
        return Declined(name, repairs)
    module, defs_b, taken = parents["a"], program.definitions(parents["b"]), []
    for gene in origin:
        if origin[gene] == "b":
            module = program.replace_gene(module, gene, defs_b[gene])
        elif origin[gene] == LIBRARY:
            allele = alleles.get(gene, carried[LIBRARY][gene])
            module = allele.placed(module)
            taken.append(allele.module)
    # Missing helpers come from b first: the child is a's module, so all it lacks is b's
    # (and a library allele's, from its own file).
    library = [*taken, alleles.shared_module()] if taken else []
    child = program.finish(module, library + [parents["b"], parents["a"], program.seed_module()])
    child = programmatic_launch.kept(child)  # a's launchers may pass the flag to b's kernels
    for p, source in zip(("a", "b"), sources):
        if child == source and p not in copies_of:
            return Declined(name, f"the child is a copy of parent {p}")
    return Applied(child, name, {"genes": origin, "repairs": repairs})


def settle(origin: dict, carried: dict) -> dict | str:
    """Move genes between parents (or to the library's allele, `carried[LIBRARY]`) until the
    child's alleles meet every requirement; the repairs (gene -> where it now comes from),
    or why they cannot settle."""
    def other(p):
        return "b" if p == "a" else "a"

    pinned, repairs = set(), {}
    while (violation := requirements.first_violation(assignment := {g: carried[p][g] for g, p in origin.items()})) \
            is not None:
        gene, needed, allowed = violation
        wanted = requirements.allowed_by_all(assignment, needed, allowed)
        parents = (origin[gene], other(origin[gene])) if origin[gene] != LIBRARY else ("a", "b")
        donor = next((p for p in parents if carried[p][needed] in wanted), None)
        if donor is None and (shared := library_allele(needed, wanted, carried)) is not None:
            carried[LIBRARY][needed], donor = shared, LIBRARY
        donor = donor or next((p for p in parents if carried[p][needed] in allowed), None)
        if needed not in pinned and donor is not None:
            moved, origin[needed] = needed, donor
        elif gene not in pinned:
            moved, origin[gene] = gene, other(origin[gene])
        else:
            return f"cannot settle {gene} needing {needed} in {list(allowed)}"
        pinned.add(moved)
        repairs[moved] = origin[moved]
    return repairs


def library_allele(gene: str, wanted, carried: dict) -> str | None:
    """The first of `wanted` the library has, that runs wherever the parents do (a CUDA-only
    allele only for parents that already carry one)."""
    on_cuda = any(getattr(alleles.get(g, a), "devices", "any") == "cuda"
                  for p in ("a", "b") for g, a in carried[p].items())
    for name in wanted:
        allele = alleles.get(gene, name)
        if allele is not None and (allele.devices == "any" or on_cuda):
            return name
    return None
