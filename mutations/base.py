"""What every rewrite of engine source returns, and what an operator is.

An operator is deterministic given its RNG: the same source and seed give the same child.
It never raises for a program it cannot rewrite: it returns `Declined` with the reason,
which lands in history.csv.
"""
import random
from dataclasses import dataclass, field


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
    """Base of every mutation operator; subclasses set the class attributes and `rewrite`."""
    name: str = ""
    kind: str = ""  # "allele" | "structural"
    devices: str = "any"  # "any" | "cuda": where programs it writes can run
    description: str = ""  # one line, shown by `python -m mutations list`

    def can_run_on(self, device: str) -> bool:
        return self.devices == "any" or str(device).startswith("cuda")

    def applies(self, source: str) -> str | None:
        """None when this operator can rewrite `source`, else the reason it cannot."""
        raise NotImplementedError

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        raise NotImplementedError

    def apply(self, source: str, rng: random.Random) -> Applied | Declined:
        """`rewrite` behind the precondition; a child equal to its parent is a decline."""
        reason = self.applies(source)
        if reason is not None:
            return Declined(self.name, reason)
        result = self.rewrite(source, rng)
        if isinstance(result, Applied) and result.source == source:
            return Declined(self.name, "the rewrite changed nothing")
        return result
