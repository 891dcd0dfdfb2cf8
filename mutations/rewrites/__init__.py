"""Structural rewrites: one libcst transformer per file, each working on any program in gene form.

Every module here is one rewrite, discovered: a `StructuralRewrite` subclass that declares
where it goes (`order`) and what the search and the tests must know of it (`draws`,
`needs_swap`, ...: mutations/README.md lists them). Helpers a rewrite copies into programs
live under kernels/, which is not searched.
"""
import importlib
import pkgutil

from mutations import program
from mutations.base import Operator


class StructuralRewrite(Operator):
    """A rewrite of any program in gene form: it applies wherever `find` finds something."""
    kind = "structural"
    declined_because = ""  # the reason given when `find` finds nothing
    # Its place among the rewrites, and so its index in all_operators(), which the search's
    # rng draws by: a new rewrite takes the next free number, and no number ever moves.
    order: int | None = None

    def find(self, module):
        """What this rewrite could change in `module`; empty when nothing."""
        raise NotImplementedError

    def applies(self, source: str) -> str | None:
        try:
            found = self.find(program.parse(source))
        except program.ProgramError as err:
            return str(err)
        return None if found else self.declined_because


def rewrite_operators() -> list:
    """One operator per module of this package, by `order`."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        classes = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, StructuralRewrite)
                   and c.__module__ == module.__name__]
        if len(classes) != 1:
            raise TypeError(f"{module.__name__} defines {len(classes)} StructuralRewrite classes, not one "
                            f"(helpers go under kernels/)")
        rewrite = classes[0]
        if not isinstance(rewrite.order, int) or rewrite.order in found:
            raise TypeError(f"{rewrite.__name__}.order = {rewrite.order!r}: each rewrite needs its own integer "
                            f"(taken: {sorted(found)})")
        found[rewrite.order] = rewrite()
    return [found[order] for order in sorted(found)]
