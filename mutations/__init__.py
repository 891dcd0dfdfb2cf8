"""Mutations: what the search can do to an engine program.

    all_operators() -> [Operator]          every operator, in a stable order
    get_operator(name) -> Operator
    applicable_operators(source, device)   names of those that run on `device` and apply
    apply_operator(name, source, rng)      one of them, chosen by the caller (evolve's bandit)
    with_work_for(name, seed)              `seed` (the seed engine's source), after the swap that
                                           gives operator `name` something to do there, if any
    is_deterministic(name)                 True when it draws nothing from the rng
    unports(name, source)                  True when it puts portable code where a GPU kernel runs
    random_mutation(source, rng, device)   one operator, uniform over the applicable ones;
                                           Declined if none
    apply_one_of(names, source, rng, device)   the same draw over a list of names
    crossover(a, b, rng)                   uniform over genes, closed under requirements
    merge_gains(a, b, base, rng, genes)    a with the genes b changed since base (of `genes`)
    intended_genes(child, parent, args)    the genes an operator meant to change

Allele swaps (`allele.<gene>.<allele>`, one per file under alleles/) and structural
rewrites (one per file under rewrites/), both discovered: README.md says how to add one.
Every result is `Applied` (source, operator, JSON-serialisable args) or `Declined`
(operator, reason); all of it is deterministic given the rng. `python -m mutations
list|apply|cross` tries them by hand.
"""
import random
from functools import lru_cache

from mutations.allele_swap import swap_operators
from mutations.base import Applied, Declined, Operator
from mutations.crossover import crossover, intended_genes, merge_gains
from mutations.rewrites import rewrite_operators

__all__ = ["Applied", "Declined", "Operator", "all_operators", "get_operator", "applicable_operators",
           "apply_operator", "with_work_for", "is_deterministic", "is_program_wide", "unports", "random_mutation",
           "apply_one_of", "crossover", "merge_gains", "intended_genes"]


@lru_cache(maxsize=None)
def _operators() -> tuple:
    return tuple(swap_operators() + rewrite_operators())


def all_operators() -> list:
    return list(_operators())


def get_operator(name: str) -> Operator:
    for op in _operators():
        if op.name == name:
            return op
    raise KeyError(f"no operator named {name!r}; `python -m mutations list` names them all")


def applicable_operators(source: str, device: str) -> list[str]:
    """Names of the operators that run on `device` and apply to `source`, in the stable order."""
    return [op.name for op in _operators() if op.can_run_on(device) and op.applies(source) is None]


def apply_operator(name: str, source: str, rng: random.Random) -> Applied | Declined:
    return get_operator(name).apply(source, rng)


def with_work_for(name: str, seed: str) -> str:
    """`seed`, or for an operator with nothing to do on it, `seed` after the swap its
    `needs_swap` names (the tests and tools that try every operator on the seed)."""
    needs = get_operator(name).needs_swap
    return get_operator(needs).apply(seed, random.Random(0)).source if needs else seed


def is_deterministic(name: str) -> bool:
    """An allele swap draws nothing from its rng: on the same program it makes the same child."""
    return get_operator(name).kind == "allele"


def is_program_wide(name: str) -> bool:
    """Whether operator `name` changes the whole program (every kernel, every matmul) rather
    than genes: a merge applies it again instead of taking genes from its child."""
    try:
        return get_operator(name).program_wide
    except KeyError:
        return False


def unports(name: str, source: str) -> bool:
    """Whether operator `name` would put portable code where `source` runs a GPU kernel."""
    return getattr(get_operator(name), "unports", lambda source: False)(source)


def random_mutation(source: str, rng: random.Random, device: str) -> Applied | Declined:
    """Apply one operator drawn uniformly from those that run on `device` and apply."""
    return apply_one_of(applicable_operators(source, device), source, rng, device)


def apply_one_of(usable: list, source: str, rng: random.Random, device: str) -> Applied | Declined:
    """Apply one of the operators named in `usable`, drawn uniformly; Declined if none."""
    if not usable:
        return Declined("random_mutation", f"no operator for {device} applies")
    return apply_operator(usable[rng.randrange(len(usable))], source, rng)
