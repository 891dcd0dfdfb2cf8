"""A program (an engine's source and how it was made), whether an operator made one, and
whether its code is the repository's alone."""
import mutations
from contract.loader import source_hash
from evolve.library import LIBRARY
from evolve.memo import Memo

ROOTS = ("seed", LIBRARY)  # the first programs whose code is the repository's: the seed, a recipe replayed on it


class Program:
    """An engine's source and its origin; the creator types in toolbox.py add `fitness`."""

    def __init__(self, source: str, parent_ids=(), operator: str = "seed", operator_args=None):
        self.source = source
        self.id = source_hash(source)
        self.parent_ids = tuple(parent_ids)
        self.operator = operator
        self.operator_args = dict(operator_args or {})

    def to_dict(self) -> dict:
        return {"source": self.source, "parent_ids": list(self.parent_ids),
                "operator": self.operator, "operator_args": self.operator_args}

    def __repr__(self):
        return f"{type(self).__name__}({self.id}, {self.operator})"


def made(result) -> bool:
    """Whether an operator's result is a program (Applied, or a Program already admitted),
    not a Declined or a Known child."""
    return isinstance(result, (mutations.Applied, Program))


def admitted(result, parent_ids: tuple, make, memo: Memo, extra_args=None):
    """The operator's child, unless the memo knows it; its Declined as it is."""
    if not made(result):
        return result
    return memo.admit(make(result.source, parent_ids, result.operator, {**result.args, **(extra_args or {})}))


def made_here(program, known, decided=None) -> bool:
    """Whether `program`'s code is the repository's alone: made by its operators from the
    seed and the library's recipes, every ancestor known (`known`: id -> program or None)
    or decided before (`decided`: id -> bool; a resumed run's checkpoint holds its own).
    A --seed-from program came from outside (unless a recipe makes it too, or the finished
    run it comes from found it made here: its args say which), and so did every program with
    it among its ancestors; an ancestor neither known nor decided counts so too."""
    decided = decided or {}
    if program.id in decided:
        return decided[program.id]
    seen, frontier = {program.id}, [program]
    while frontier:
        current = frontier.pop()
        args = current.operator_args
        if not current.parent_ids and current.operator not in ROOTS and "recipe" not in args \
                and not args.get("made_here"):
            return False
        for parent_id in set(current.parent_ids) - seen:
            seen.add(parent_id)
            if parent_id in decided:
                if not decided[parent_id]:
                    return False
                continue
            parent = known(parent_id)
            if parent is None:
                return False
            frontier.append(parent)
    return True
