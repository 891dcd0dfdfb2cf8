"""What a run remembers of its breeding, so that nothing known is bred or judged again.

- the programs seen, with their parents: the lineage in which merges find a common ancestor;
- each program's code with comments, blank lines and layout taken out (`ast` parses and
  unparses it) and its top-level functions and classes in name order: a child that differs
  from a known program only in those is that program (a crossover or a swap that lands a
  helper elsewhere in the file makes the same engine);
- the applications tried, (operator, args, parent ids): the same one bred again makes the
  same child, so it is not;
- the operators spent on a parent: tried when they draw nothing from the rng, declined
  there, or failed the gate there. They are not drawn for that parent again, nor for its
  copies (a copy has the parent's source, so its id).

Scores already keep a source from being judged twice (they are keyed by its hash); the memo
keeps a breeding slot from being spent on what is known. It lives as long as the run's
process: a resumed run starts it again from the population it restores.
"""
import ast
import json
from dataclasses import dataclass

from contract.loader import source_hash

MERGE = "merge"  # the key under which a merge of (a, b, base) is spent
MERGE_DECLINED = "merge declined"  # ... and (a, b) when it declined: b had nothing for a


@dataclass(frozen=True)
class Known:
    """A child not worth judging, and why; it counts as cached. `twin`: the id of the known
    program with its code, when that is why."""
    operator: str
    reason: str
    twin: str | None = None


def normalized_id(source: str) -> str:
    """The id of a source's code alone: comments, blank lines, layout and the order of its
    top-level definitions do not change it. Other statements keep their order: they run at
    import, definitions only bind names (one used at import before its definition fails
    the gate in either order)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source_hash(source)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    statements = [node for node in tree.body if not isinstance(node, defs)]
    definitions = sorted((node for node in tree.body if isinstance(node, defs)), key=lambda node: node.name)
    return source_hash(ast.unparse(ast.Module(body=statements + definitions, type_ignores=[])))


class Memo:
    def __init__(self):
        self.programs = {}  # id -> program
        self.by_code = {}  # normalized id -> id of the first program seen with that code
        self.applied = set()  # (operator, args as JSON, parent ids)
        self.spent = set()  # (operator, parent ids)
        self.twins = []  # (operator, known id, parent ids) of children found known by their code

    def see(self, programs) -> None:
        for p in programs:
            if p.id not in self.programs:
                self.programs[p.id] = p
                self.by_code.setdefault(normalized_id(p.source), p.id)

    def program(self, program_id: str | None):
        return self.programs.get(program_id)

    def is_spent(self, operator: str, parent_ids: tuple) -> bool:
        return (operator, tuple(parent_ids)) in self.spent

    def spend(self, operator: str, parent_ids: tuple) -> None:
        self.spent.add((operator, tuple(parent_ids)))

    def merge_declined(self, a_id: str, b_id: str) -> bool:
        """Whether merging b into a or into an ancestor of a declined: what b brings, a has
        (or cannot take)."""
        return any(self.is_spent(MERGE_DECLINED, (pid, b_id)) for pid in self.ancestors(a_id))

    def admit(self, child, deterministic: bool = False):
        """`child`, now seen; or Known when its application was tried before or its code is
        a known program's. A deterministic operator is spent on the parent either way."""
        if deterministic:
            self.spend(child.operator, child.parent_ids)
        key = (child.operator, json.dumps(child.operator_args, sort_keys=True, default=str), child.parent_ids)
        twin = self.by_code.get(normalized_id(child.source))
        if key in self.applied:
            self.spend(child.operator, child.parent_ids)
            return Known(child.operator, "applied to the same parents before", twin)
        self.applied.add(key)
        # Its own id too: two operators (a merge and a sweep) can breed one source in a
        # generation; it is judged once, and the brood would be a child short.
        if twin is not None:
            self.twins.append((child.operator, twin, child.parent_ids))  # its operator made `twin`
            return Known(child.operator, f"the code of {twin}, comments and layout aside", twin)
        self.see([child])
        return child

    def take_twins(self) -> list:
        """The (operator, known id, parent ids) found since the last call: what those
        operators made, to be credited like the children judged."""
        twins, self.twins = self.twins, []
        return twins

    def ancestors(self, program_id: str) -> dict:
        """id -> generations back, for the program itself (0) and every ancestor seen."""
        found, frontier = {program_id: 0}, [program_id]
        while frontier:
            parents = [(parent, found[pid] + 1) for pid in frontier
                       for parent in getattr(self.programs.get(pid), "parent_ids", ())]
            frontier = [parent for parent, _ in parents if parent not in found]
            for parent, depth in parents:
                found.setdefault(parent, depth)
        return found

    def mutations_since(self, program_id: str, base_id: str) -> list:
        """(mutant, its parent or None if unseen) of each mutation in `program_id`'s lineage
        that is not in `base_id`'s: what was done to make it since the two parted."""
        before = self.ancestors(base_id)
        steps = [self.programs.get(pid) for pid in self.ancestors(program_id) if pid not in before]
        return [(p, self.programs.get(p.parent_ids[0])) for p in steps if p is not None and len(p.parent_ids) == 1]

    def operators_since(self, program_id: str, base_id: str) -> set:
        """The operators of those mutations."""
        return {mutant.operator for mutant, _ in self.mutations_since(program_id, base_id)}

    def common_ancestor(self, a_id: str, b_id: str) -> str | None:
        """The nearest program both descend from (fewest generations in all), if seen."""
        up_a, up_b = self.ancestors(a_id), self.ancestors(b_id)
        common = sorted((up_a[i] + up_b[i], i) for i in up_a if i in up_b)
        return common[0][1] if common else None
