"""How the search chooses what to do to a program: the operators it can draw from, the
bandit that draws them, what a child's judgement says about its operator, and the pairs of
gains worth merging.

The bandit is an AUC bandit (Fialho et al., "Comparison-based adaptive strategy selection
with bandits in differential evolution"; OpenTuner's AUCBanditMetaTechnique): an
operator's score is the area under the curve of its recent credits (later ones weigh
more) plus an upper-confidence exploration term, and the highest score is drawn. An
operator never tried is drawn before any tried one. evolve/README.md ("How the search
chooses") says why the constants are what they are.
"""
import math
import random
from functools import lru_cache

from contract.devices import is_cuda
from evolve.memo import MERGE

# A child is an improvement when it is this much faster than its parent: less is noise.
IMPROVEMENT = 0.05
# The outcomes of a child, and the credit each gives the operator that made it.
IMPROVED, NEUTRAL, FAILED, DECLINED = "improved", "neutral", "failed", "declined"
# A correct child that is no faster earns a little: its operator may pay off in company,
# and among operators that never paid off, one that keeps programs correct goes first.
CREDIT = {IMPROVED: 1.0, NEUTRAL: 0.1, FAILED: 0.0, DECLINED: 0.0}
# Exploration weight: an operator that paid off once, then failed three times in a row,
# yields to one tried once without success (simulated: as good as OpenTuner's 0.05 when a
# few operators pay off, and it revisits one that was unlucky on its first try).
EXPLORATION = 0.1
# Outcomes remembered: most of a GPU run (60-150 judgements), so credit fades only late.
WINDOW = 100
# The sweep of generation 1 judges at most this many children, and at most what fits in
# this share of the time left.
MAX_SWEEP = 40
SWEEP_SHARE = 0.5
# Gains are merged between the fittest correct programs seen, at most this many.
MERGE_POOL = 12


class OperatorSelector:
    """An AUC bandit over operator names. Its state is plain data (`to_dict`/`from_dict`)."""

    def __init__(self, exploration: float = EXPLORATION, window: int = WINDOW):
        self.exploration, self.window = exploration, window
        self.outcomes: list[list] = []  # [name, credit], oldest first, at most `window`
        self.tried: set[str] = set()  # every name ever credited, also after its outcomes slid out

    def choose(self, names: list, rng: random.Random, rank=lambda name: 0) -> str:
        """The name with the best score; ties broken by `rank` (lowest first), then `rng`."""
        assert names, "choose needs at least one operator name"
        order = list(names)
        rng.shuffle(order)
        order.sort(key=rank)  # stable: random within a rank; max keeps the first of equals
        return max(order, key=self.score)

    def reward(self, name: str, result: str) -> None:
        """Remember `result` (IMPROVED, NEUTRAL, FAILED or DECLINED) as `name`'s latest."""
        self.outcomes.append([name, CREDIT[result]])
        self.tried.add(name)
        del self.outcomes[:-self.window]

    def score(self, name: str) -> float:
        if name not in self.tried:
            return math.inf
        uses = sum(1 for n, _ in self.outcomes if n == name)
        explore = math.sqrt(2.0 * math.log(max(len(self.outcomes), 2)) / max(uses, 1))
        return self.area_under_curve(name) + self.exploration * explore

    def area_under_curve(self, name: str) -> float:
        """Credits weighted by position (the k-th use weighs k), over the most they could be:
        1.0 for an operator that always paid off, more for recent pay-offs than old ones."""
        credits = [c for n, c in self.outcomes if n == name]
        weighted = sum(position * c for position, c in enumerate(credits, start=1))
        return 2.0 * weighted / (len(credits) * (len(credits) + 1)) if credits else 0.0

    def to_dict(self) -> dict:
        return {"exploration": self.exploration, "window": self.window,
                "outcomes": [list(o) for o in self.outcomes], "tried": sorted(self.tried)}

    @classmethod
    def from_dict(cls, state: dict) -> "OperatorSelector":
        selector = cls(state["exploration"], state["window"])
        selector.outcomes = [list(o) for o in state["outcomes"]]
        selector.tried = set(state["tried"])
        return selector

    def load(self, state: dict | None) -> None:
        """Take `state` (a checkpoint's) in place: the toolbox holds this object."""
        if state:
            vars(self).update(vars(self.from_dict(state)))


def outcome(scores, child_id: str, parent_id: str) -> str | None:
    """What a judged child says about the operator that made it; None when not judged."""
    if child_id not in scores:
        return None
    if not scores.is_ok(child_id):
        return FAILED
    ratio = scores.gain(child_id, parent_id)
    return IMPROVED if ratio is not None and ratio > 1.0 + IMPROVEMENT else NEUTRAL


def sweep_size(time_left_s: float, judge_s: float, workers: int, population: int) -> int:
    """Children in the sweep: as many as fit in SWEEP_SHARE of the time left, at most
    MAX_SWEEP, at least a population's worth."""
    fits = int(SWEEP_SHARE * time_left_s * workers / max(judge_s, 1e-3))
    return max(population, min(MAX_SWEEP, fits))


# sweep_rank's ranks, first to last.
OWN, LEVER, OTHER, DEMOTED = 0, 1, 2, 3


def sweep_rank(name: str, device: str, vocabulary) -> int:
    """Where an operator goes in a sweep that cannot take them all (random within a rank):
    first the swaps of the genes the target's own family brings (`Vocabulary.own_genes`: the
    seed's reference-like MoE or DeltaNet; a 20-minute search from the seed on 4 layers of
    Qwen3-30B-A3B drew 7 of the 18 GPU-only operators at random, none of them the MoE's, and
    returned the seed: docs/log/2026-11-29-moe-search-from-seed-hybrid-one-gpu-sweep.md);
    then on a GPU the GPU-only operators (kernels and graphs are the large levers there:
    docs/log/2026-11-21-every-operator-alone-on-seed.md); last, swaps back to a seed allele
    (from the seed they have nothing to do), the operators slow to judge (their
    `slow_to_judge` says why) and, on a CPU, the GPU's levers (`gpu_lever`: CUDA graphs ran
    at 0.15x there, and a program that slow made its batch of screens last 3x as long:
    docs/log/2026-11-23-cpu-default-run-gpu-levers-last.md)."""
    on_gpu, lever = is_cuda(device), vocabulary.is_gpu_lever(name)
    if name.endswith(".seed") or vocabulary.is_slow_to_judge(name) or (not on_gpu and lever):
        return DEMOTED
    if vocabulary.gene_of(name) in vocabulary.own_genes:
        return OWN
    return LEVER if on_gpu and (vocabulary.devices_of(name) == "cuda" or lever) else OTHER


def gain_pairs(programs: list, scores, memo, seed, limit: int) -> list:
    """Up to `limit` (a, b, base) to merge, best first: a and b correct, both faster than
    `base` (their nearest common ancestor, or the seed) by IMPROVEMENT, b made by an
    operator a's lineage lacks since then, not merged before, nor declined into an
    ancestor of a; a is the faster one."""
    correct = {p.id: p for p in programs if scores.is_ok(p.id)}
    pool = sorted(correct.values(), key=lambda p: (-scores.values(p.id, False)[0], p.id))[:MERGE_POOL]
    found = []
    for i, a in enumerate(pool):
        for b in pool[i + 1:]:
            base = memo.program(memo.common_ancestor(a.id, b.id)) or seed
            made_b = memo.operators_since(b.id, base.id)  # empty when b's lineage is unknown
            if base.id in (a.id, b.id) or memo.is_spent(MERGE, (a.id, b.id, base.id)) \
                    or (made_b and made_b <= memo.operators_since(a.id, base.id)) \
                    or memo.merge_declined(a.id, b.id):
                continue
            gains = scores.gain(a.id, base.id), scores.gain(b.id, base.id)
            if all(g is not None and g > 1.0 + IMPROVEMENT for g in gains):
                found.append((gains[0] * gains[1], a, b, base))
    found.sort(key=lambda f: -f[0])
    return [(a, b, base) for _, a, b, base in found[:limit]]


class Vocabulary:
    """The operator module's functions. A module with only `random_mutation` and
    `crossover` (the --operators stand-ins) is drawn from at random and never merges.
    `idle_genes`: genes the target never runs (contract.families.idle_genes), whose swaps
    would make programs that compute as their parent does; `own_genes`: those its family
    brings (contract.families.own_genes), swept first."""

    def __init__(self, module, mutate_fn, mate_fn, idle_genes=frozenset(), own_genes=frozenset()):
        self.random_mutation, self.crossover = mutate_fn, mate_fn
        self.idle_genes, self.own_genes = idle_genes, own_genes
        applicable = getattr(module, "applicable_operators", None)
        self.apply = getattr(module, "apply_operator", None)
        self.can_choose = callable(applicable) and callable(self.apply)
        self.applicable = lru_cache(maxsize=256)(applicable) if self.can_choose else None
        self.merge_gains = getattr(module, "merge_gains", None)
        self.intended_genes = getattr(module, "intended_genes", None)
        self.intents = {}  # (child id, parent id) -> the genes its operator meant to change
        self.differences = {}  # (id, id) -> the genes in which the two programs differ
        get_operator = getattr(module, "get_operator", None)
        self.get_operator = get_operator if callable(get_operator) else None
        self.devices_of = lambda name: self.declared(name, "devices", "any")
        self.is_slow_to_judge = lambda name: self.declared(name, "slow_to_judge", False)
        self.is_gpu_lever = lambda name: self.declared(name, "gpu_lever", False)
        self.sweep_places = lambda name: self.declared(name, "sweep_places", 1)
        self.draws = lambda name: self.declared(name, "draws", False)
        self.cannot_serve = lambda name: self.declared(name, "cannot_serve", ())
        self.gene_of = lambda name: getattr(self.declared(name, "allele", None), "gene", None)  # None: no swap
        self.is_deterministic = getattr(module, "is_deterministic", lambda name: False)
        self.is_program_wide = getattr(module, "is_program_wide", lambda name: False)
        self.unports = getattr(module, "unports", lambda name, source: False)

    def declared(self, name: str, attribute: str, default):
        """What operator `name` declares (mutations.base.Operator's attributes); `default` for
        a vocabulary that cannot name its operators."""
        return getattr(self.get_operator(name), attribute, default) if self.get_operator else default

    def intended(self, child, parent) -> set | None:
        """The genes `child`'s operator meant to change in `parent`; None when the vocabulary
        cannot say (a merge then takes every gene that differs)."""
        if self.intended_genes is None:
            return None
        key = (child.id, parent.id)
        if key not in self.intents:
            self.intents[key] = set(self.intended_genes(child.source, parent.source, child.operator_args))
        return self.intents[key]

    def operator_of(self, program):
        """The operator that made `program`; None for a merge, a crossover, the seed, or a
        vocabulary that cannot name its operators."""
        if self.get_operator is None:
            return None
        try:
            return self.get_operator(program.operator)
        except KeyError:
            return None

    def replay(self, program, source: str):
        """`program`'s operator applied to `source` with the args it was applied with; None
        when the vocabulary cannot replay."""
        operator = self.operator_of(program)
        return operator.replay(source, program.operator_args) if hasattr(operator, "replay") else None

    def extend(self, program, source: str):
        """`program`'s move made once more on `source` (Operator.extend); None when its
        operator cannot say."""
        operator = self.operator_of(program)
        return operator.extend(source, program.operator_args) if hasattr(operator, "extend") else None

    def reapply(self, program, source: str, rng: random.Random):
        """`program`'s operator applied afresh to `source` (its own choices, not the recorded
        ones: a program-wide rewrite's args list what it found in its parent)."""
        return self.apply(program.operator, source, rng) if self.apply is not None else None

    def differing(self, a, b) -> set:
        """The genes in which programs `a` and `b` differ (needs `intended_genes`)."""
        key = (a.id, b.id)
        if key not in self.differences:
            self.differences[key] = set(self.intended_genes(a.source, b.source, {}))
        return self.differences[key]

    def merge(self, a: str, b: str, base: str, rng: random.Random, genes: set | None = None, b_whole=False):
        """merge_gains, taking from b only `genes` if given (`intended` named them); with
        `b_whole`, a child that is b itself is kept, not declined."""
        if genes is None:  # the stand-ins' merge_gains takes neither
            return self.merge_gains(a, b, base, rng)
        return self.merge_gains(a, b, base, rng, genes=genes, b_whole=b_whole)
