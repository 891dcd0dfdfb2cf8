"""Crossover: a child taking each gene from either parent, closed under declared requirements.

Each gene both parents define comes from parent a or b with probability 1/2 (uniform
crossover over genes). Requirements are then settled by pulling genes from the parent
that has what is needed: for a violation (gene G, from parent p, needs gene H in a set of
alleles), H is taken from whichever parent carries an allowed allele, preferring p; failing
that, G is taken from the other parent. Each gene is moved once at most, so this ends; if it
cannot settle, or the child is a copy of a parent, crossover declines. The child brings
each gene's helpers and imports from the parent that gave the gene (then from the seed),
and drops what nothing uses.
"""
import random

from mutations import program, requirements
from mutations.base import Applied, Declined

NAME = "crossover"


def crossover(a: str, b: str, rng: random.Random) -> Applied | Declined:
    try:
        parents = {"a": program.parse(a), "b": program.parse(b)}
    except program.ProgramError as err:
        return Declined(NAME, str(err))
    carried = {p: program.gene_alleles(mod) for p, mod in parents.items()}
    defs = {p: program.definitions(mod) for p, mod in parents.items()}
    genes = [g for g in program.GENES if g in carried["a"] and g in carried["b"]]
    if all(program.code(defs["a"][g]) == program.code(defs["b"][g]) for g in genes):
        return Declined(NAME, "the parents carry the same genes")
    origin = {g: "a" if rng.random() < 0.5 else "b" for g in genes}

    def assignment():
        return {g: carried[origin[g]][g] for g in genes}

    def other(p):
        return "b" if p == "a" else "a"

    def take_needed(needed, allowed):
        for p in (origin_of_violator[0], other(origin_of_violator[0])):
            if carried[p][needed] in allowed:
                origin[needed] = p
                return carried[p][needed]
        return None

    def take_gene(gene):
        origin[gene] = other(origin[gene])
        return carried[origin[gene]][gene]

    pinned, repairs = set(), {}
    while (violation := requirements.first_violation(assignment())) is not None:
        gene, needed, allowed = violation
        origin_of_violator = [origin[gene]]
        if needed not in pinned and take_needed(needed, allowed) is not None:
            pinned.add(needed)
            repairs[needed] = origin[needed]
        elif gene not in pinned:
            take_gene(gene)
            pinned.add(gene)
            repairs[gene] = origin[gene]
        else:
            return Declined(NAME, f"cannot settle {gene} needing {needed} in {list(allowed)}")
    module = parents["a"]
    for gene in genes:
        if origin[gene] == "b":
            module = program.replace_gene(module, gene, defs["b"][gene])
    # Missing helpers come from b first: the child is a's module, so all it lacks is b's.
    child = program.finish(module, [parents["b"], parents["a"], program.seed_module()])
    for p, source in (("a", a), ("b", b)):
        if child == source:
            return Declined(NAME, f"the child is a copy of parent {p}")
    return Applied(child, NAME, {"genes": origin, "repairs": repairs})
