"""A program (an engine's source and how it was made), and whether an operator made one."""
import mutations
from contract.loader import source_hash
from evolve.memo import Memo


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
