"""Declared requirements between genes: finding a violation, and settling them.

An assignment maps each gene to the allele it carries. It is closed when every allele's
REQUIRES is met: a paged decode attention never sits beside a per-request KV cache.
"""
from mutations import alleles, program


def first_violation(assignment: dict) -> tuple | None:
    """(gene, needed gene, allowed alleles) of the first unmet requirement, in gene order."""
    for gene in program.GENES:
        if gene not in assignment:
            continue
        for needed, allowed in alleles.requirements(gene, assignment[gene]).items():
            if needed in assignment and assignment[needed] not in allowed:
                return gene, needed, allowed
    return None


def settle(assignment: dict, pinned: set, fix_needed, fix_gene) -> tuple:
    """Repair violations until the assignment is closed; (assignment, repairs) or (None, why).

    For a violation (gene needs `needed` in `allowed`): when `needed` is not pinned,
    `fix_needed` names its new allele, one every other gene admits too where it can (folded
    q/k/v norms need fused q/k/v weights, the folded MLP norm fused gate/up: their first
    allowed allele each sent the other gene back to the seed, where `fused_both` serves both);
    otherwise, when `gene` is not pinned, `fix_gene(gene)` does. Each repaired gene is pinned,
    so this ends.
    """
    assignment, pinned, repairs = dict(assignment), set(pinned), {}
    while True:
        violation = first_violation(assignment)
        if violation is None:
            return assignment, repairs
        gene, needed, allowed = violation
        choice = None
        if needed not in pinned:
            choice = fix_needed(needed, allowed_by_all(assignment, needed, allowed)) or fix_needed(needed, allowed)
        if choice is not None:
            target, allele = needed, choice
        elif gene not in pinned and (choice := fix_gene(gene)) is not None:
            target, allele = gene, choice
        else:
            return None, f"{gene}={assignment[gene]} needs {needed} in {list(allowed)}, " \
                         f"has {assignment[needed]} and neither can change"
        assignment[target] = allele
        repairs[target] = allele
        pinned.add(target)


def allowed_by_all(assignment: dict, needed: str, allowed) -> tuple:
    """The alleles of `needed` that `allowed` and every other gene's requirement admit."""
    wanted = list(allowed)
    for gene, allele in assignment.items():
        if gene != needed and needed in (demands := alleles.requirements(gene, allele)):
            wanted = [a for a in wanted if a in demands[needed]]
    return tuple(wanted)
