"""Mutations: what the search can do to an engine program.

    all_operators() -> [Operator]          every operator, in a stable order
    get_operator(name) -> Operator
    random_mutation(source, rng, device)   one operator, uniform over those that run on
                                           `device` and apply to `source`; Declined if none
    crossover(a, b, rng)                   uniform over genes, closed under requirements

Allele swaps (`allele.<gene>.<allele>`, one per file under alleles/) and structural
rewrites (one per file under rewrites/). Every result is `Applied` (source, operator,
JSON-serialisable args) or `Declined` (operator, reason); all of it is deterministic given
the rng. `python -m mutations list|apply|cross` tries them by hand.
"""
import random
from functools import lru_cache

from mutations.allele_swap import swap_operators
from mutations.base import Applied, Declined, Operator
from mutations.crossover import crossover
from mutations.rewrites.fuse_linears import FuseLinearsOperator
from mutations.rewrites.hoist_tables import HoistTablesOperator
from mutations.rewrites.last_token_logits import LastTokenLogitsOperator
from mutations.rewrites.torch_compile import TorchCompileOperator
from mutations.rewrites.tune_constant import TuneConstantOperator

__all__ = ["Applied", "Declined", "Operator", "all_operators", "get_operator", "random_mutation", "crossover"]


@lru_cache(maxsize=None)
def _operators() -> tuple:
    structural = [FuseLinearsOperator(), TorchCompileOperator(), TuneConstantOperator(),
                  HoistTablesOperator(), LastTokenLogitsOperator()]
    return tuple(swap_operators() + structural)


def all_operators() -> list:
    return list(_operators())


def get_operator(name: str) -> Operator:
    for op in _operators():
        if op.name == name:
            return op
    raise KeyError(f"no operator named {name!r}; `python -m mutations list` names them all")


def random_mutation(source: str, rng: random.Random, device: str) -> Applied | Declined:
    """Apply one operator drawn uniformly from those that run on `device` and apply."""
    usable = [op for op in _operators() if op.can_run_on(device) and op.applies(source) is None]
    if not usable:
        return Declined("random_mutation", f"no operator for {device} applies")
    return usable[rng.randrange(len(usable))].apply(source, rng)
