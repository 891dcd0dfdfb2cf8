"""Structural rewrites: one libcst transformer per file, each working on any program in gene form."""
from mutations import program
from mutations.base import Operator


class StructuralRewrite(Operator):
    """A rewrite of any program in gene form: it applies wherever `find` finds something."""
    kind = "structural"
    declined_because = ""  # the reason given when `find` finds nothing

    def find(self, module):
        """What this rewrite could change in `module`; empty when nothing."""
        raise NotImplementedError

    def applies(self, source: str) -> str | None:
        try:
            found = self.find(program.parse(source))
        except program.ProgramError as err:
            return str(err)
        return None if found else self.declined_because
