"""What every rewrite of engine source returns, and what an operator is.

An operator is deterministic given its RNG: the same source and seed give the same child.
It never raises for a program it cannot rewrite: it returns `Declined` with the reason,
which lands in history.csv. `replay` applies it again as history.csv recorded it (a
recipe line): the choices it once drew from its RNG are taken from the recorded args.
"""
import json
import random
from dataclasses import dataclass, field

from contract.devices import is_cuda


@dataclass(frozen=True)
class Applied:
    """A child program and how it was made."""
    source: str
    operator: str
    args: dict = field(default_factory=dict)  # the choices the operator made, JSON-serialisable


@dataclass(frozen=True)
class Declined:
    operator: str
    reason: str


class Operator:
    """Base of every mutation operator; subclasses set the class attributes and `rewrite`,
    and `rewrite_as` when `rewrite` draws a choice from its RNG (`draws`)."""
    name: str = ""
    kind: str = ""  # "allele" | "structural"
    devices: str = "any"  # "any" | "cuda": where programs it writes can run
    description: str = ""  # one line, shown by `python -m mutations list`
    program_wide: bool = False  # what it changes is a property of the whole program, not of genes
    # `rewrite` draws a choice from its rng: then `rewrite_as` must make the recorded one, or
    # a replay quietly makes Random(0)'s (tests/test_operator_registry.py holds it to this).
    draws: bool = False
    needs_swap: str = ""  # the swap that gives it something to do on the seed, when the seed has nothing
    slow_to_judge: bool = False  # its children take far longer to judge: a sweep tries it last
    sweep_places: int = 1  # children one sweep may make of one program (each a fresh draw)
    gpu_lever: bool = False  # runs anywhere, pays off on a GPU alone: first in a GPU's sweep, last on a CPU
    cannot_serve: tuple = ()  # seed genes of the families whose models its programs cannot run

    def can_run_on(self, device: str) -> bool:
        return self.devices == "any" or is_cuda(device)

    def applies(self, source: str) -> str | None:
        """None when this operator can rewrite `source`, else the reason it cannot."""
        raise NotImplementedError

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        raise NotImplementedError

    def rewrite_as(self, source: str, args: dict) -> Applied | Declined:
        """The rewrite making the choices recorded in `args`. An operator that draws nothing
        from its RNG just rewrites; `replay` checks that it made what was recorded."""
        return self.rewrite(source, random.Random(0))

    def apply(self, source: str, rng: random.Random) -> Applied | Declined:
        """`rewrite` behind the precondition; a child equal to its parent is a decline."""
        return self.guarded(source, lambda: self.rewrite(source, rng))

    def extend(self, source: str, args: dict) -> Applied | Declined:
        """The move recorded in `args` made once more on the program it made (a doubling
        doubled again), for a search that found the first one a gain; most moves have no
        such next step."""
        return Declined(self.name, "its moves have no next step")

    def replay(self, source: str, args: dict) -> Applied | Declined:
        """This operator as `args` recorded it; declines when it cannot make that choice, or
        made a different one (every recorded arg must match; missing ones are free)."""
        return self.guarded(source, lambda: agreeing(self.rewrite_as(source, args), args))

    def guarded(self, source: str, rewrite) -> Applied | Declined:
        reason = self.applies(source)
        if reason is not None:
            return Declined(self.name, reason)
        result = rewrite()
        if isinstance(result, Applied) and result.source == source:
            return Declined(self.name, "the rewrite changed nothing")
        return result


def agreeing(result: Applied | Declined, recorded: dict) -> Applied | Declined:
    """`result`, or a decline naming the first recorded arg it does not match."""
    if isinstance(result, Declined):
        return result
    made = json.loads(json.dumps(result.args))  # as history.csv holds them: lists, not tuples
    for key, value in recorded.items():
        if made.get(key) != value:
            return Declined(result.operator, f"recorded {key}={json.dumps(value)}, "
                                             f"this program gives {key}={json.dumps(made.get(key))}")
    return result


def agrees(choice: dict, recorded: dict) -> bool:
    """Whether a choice an operator could make matches every recorded arg it names."""
    made = json.loads(json.dumps(choice))
    return all(made.get(key) == value for key, value in recorded.items() if key in made)
