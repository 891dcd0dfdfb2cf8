"""The generation loop: breed, screen, merge, confirm, learn, score, select, remember,
report, checkpoint.

Generation 0 judges the floor in full first: the first of the first population's other programs
(--seed-from's, then the library's best match first) that passes (the next, while those fail).
Then the seed and the rest are screened beside it, and the fastest of them confirmed.
Generation 1 sweeps: one child of the best program by each operator that applies to it (the
swaps of the target family's own genes first; on a GPU, each GPU-only one, and others up to a
population's worth), on a GPU after their stack, one child with all of them (stack.py). Every later one merges gains
made apart (up to a third of its children), sweeps on from the best program with all but one
of the rest (operators not tried on it, GPU-only first, then as the bandit ranks them, those
the run never tried every other place), then breeds the last by crossover or by the operator
the bandit draws (more when operators decline or repeat), up to as many children as the
population holds. From generation 1 on, once its children are screened, the gains among them
that the best lacks are merged into it in one more child, screened too, before the fastest
are confirmed.
evolve/README.md ("How the search chooses") says why.
"""
import time
from dataclasses import dataclass

from evolve.judging import confirm, unjudged
from evolve.memo import Known
from evolve.operators import sweep_size
from evolve.program import Program

# At most a third of a later generation's children are pair merges: they combine gains
# found apart, and the rest must go on finding new ones (evolve/README.md, "Merging gains").
CHILDREN_PER_MERGE = 3
# Draws of crossover or mutation per child wanted: operators decline or repeat a program,
# so a generation may take more draws than children, but not forever.
MAX_DRAWS_PER_CHILD = 3


@dataclass(frozen=True)
class Budget:
    """What the time left allows when a generation breeds (Search.budget)."""
    left_s: float  # of the run's wall-clock budget
    final_s: float  # the final comparison's estimate, kept for it
    screen_s: float  # one screen's estimate
    workers: int

    def sweep_limit(self, num_children: int) -> int:
        """Children a sweep may make: operators.sweep_size of the time before the final."""
        return sweep_size(self.left_s - self.final_s, self.screen_s, self.workers, num_children)


@dataclass(frozen=True)
class Breeding:
    """What breeding draws on, the same all run: the operators, the scores, the seed, the
    run's rng and the crossover probability."""
    toolbox: object
    scores: object
    seed: Program
    rng: object
    crossover_prob: float


@dataclass(frozen=True)
class GenerationRecord:
    """What a generation did, for the logbook, the console and results.log
    (Search.finish_generation)."""
    new_results: list  # (fitness, verdict) of each judgement
    num_cached: int
    num_declined: int
    seconds: float


def evolve(search) -> None:
    """Generations until the count or the budget runs out (../shared/DESIGN.md, "The search (evolve/)")."""
    toolbox, config = search.toolbox, search.config
    while search.should_continue():
        gen, started = search.generation, time.monotonic()
        # Breed: a sweep of every operator, then merges, crossovers and the bandit's mutations.
        if gen == 0:
            brood, parents = Brood(search.population, search.num_first_declined), []
        else:
            parents = search.population
            brood = breed(search.breeding, parents, list(search.hall_of_fame), config.population, gen, search.budget())
        for declined, parent_ids in brood.declined:
            search.record_decline(declined, parent_ids)
        offspring = brood.children
        # Judge each new source once, beside its parent; generation 0's beside its floor.
        num_cached = brood.num_known + sum(p.id in search.scores for p in offspring)
        new = first_judgements(search, offspring) if gen == 0 else search.screen_children(gen, offspring)
        # Merge the gains just screened into the best at once, not a generation later: a
        # short search's last generation has no later one (docs/log/2026-11-24-1b-peak-memory.md).
        best = best_of(search.hall_of_fame, search.seed)
        if gen > 0 and brood.add_if_new(toolbox.merge_every_gain(best, search.scores)):
            new += search.screen(gen, offspring[-1:])
        # Confirm the ones that could be kept (in generation 0, beside the floor).
        confirm(search.judging, search.hall_of_fame, gen, offspring, beside=search.floor.id if gen == 0 else None)
        # Learn: each mutant's outcome against its parent is credited to its operator.
        toolbox.learn(offspring, search.scores)
        # Score: a program's fitness is its fitted speed (scores.py: every judgement and paired ratio).
        search.assign_fitness(parents + offspring + list(search.hall_of_fame))
        # Remember: the hall of fame, and the best correct program in workspace/engine.py.
        search.update_best(parents + offspring)
        # Select: the elite kept, tournaments for the rest (or NSGA-II on both objectives).
        search.population = toolbox.select(parents + offspring, config.population)
        # Report and checkpoint: one record for the console, results.log and the logbook.
        search.finish_generation(GenerationRecord(new, num_cached, brood.num_declined, time.monotonic() - started))


def first_judgements(search, programs: list) -> list:
    """Generation 0: the floor, the first of the other first programs (--seed-from's, the
    library's best match first) that passes a full judgement (one confirmed in an earlier
    run serves at once), becomes `search.floor`; then the seed and the rest, screened beside
    it (or, with no floor, the seed in full and the rest beside it). The floor goes first so
    that a budget too short for the rest still returns it: a 5-minute Qwen3-0.6B search
    judged the seed in full, screened five library programs 28x faster, and returned the
    seed, the only program judged in full. Beside the eager seed, five screens took 531 s of
    a 20-minute Qwen3 search against ~60 s a screen beside a program of like speed, and their
    20-27x ratios could not rank them (docs/log/2026-11-27-cpu-qwen3-search-history-mends.md).
    Returns the new results."""
    seed = search.seed
    others = [p for p in programs if p.id != seed.id]
    search.floor = next((p for p in others if search.scores.is_confirmed(p.id)), seed)
    todo, new = unjudged(others, search.scores), []
    while todo and search.floor.id == seed.id:
        first, todo = todo[0], todo[1:]
        new += search.screen(0, [first])  # no judged parent: in full
        if search.scores.is_confirmed(first.id):
            search.floor = first
    new += search.screen(0, [seed], beside=None if search.floor.id == seed.id else search.floor.id)
    return new + search.screen(0, todo, beside=search.floor.id)


class Brood:
    """A generation's children as they are bred; the known ones (nothing new: counted as
    cached) and the declined ones (for history.csv) counted apart."""

    def __init__(self, children=(), num_declined: int = 0):
        self.children, self.num_known, self.num_declined = list(children), 0, num_declined
        self.declined = []  # (Declined, parent ids), in the order they came

    def add_if_new(self, result) -> bool:
        """Add a child, and nothing else: no decline recorded, no known one counted."""
        if isinstance(result, Program):
            self.children.append(result)
        return isinstance(result, Program)

    def add(self, result, parent_ids: tuple) -> None:
        if isinstance(result, Program):
            self.children.append(result)
        elif isinstance(result, Known):
            self.num_known += 1
        else:
            self.num_declined += 1
            self.declined.append((result, parent_ids))


def breed(breeding: Breeding, parents: list, hall_of_fame: list, num_children: int, generation: int,
          budget: Budget) -> Brood:
    """Generation 1: the sweep. Later: merges, then crossover or mutation, until there are
    `num_children` children (fewer if operators keep declining or repeating themselves)."""
    toolbox, brood = breeding.toolbox, Brood()
    toolbox.memo.see(parents + hall_of_fame)
    best = best_of(hall_of_fame, breeding.seed)
    if generation == 1:
        # The target family's own genes first (the seed's MoE runs an expert at a time), then
        # on a GPU the GPU-only operators (graphs and kernels:
        # docs/log/2026-11-23-why-search-stops-short-of-recipe.md), then the others up to a
        # population's worth: library programs carry most levers (the recipe all but one),
        # and with them alone generation 1 of a 20-minute search on a real shape judged one
        # child. On a GPU their stack first: one screen for every lever together
        # (evolve/stack.py: a 20-minute search screened ten children of one step each).
        brood.add_if_new(toolbox.stack(best))
        for result in toolbox.sweep(best, budget.sweep_limit(num_children) - len(brood.children), levers_only=True):
            brood.add(result, (best.id,))
        for result in toolbox.sweep(best, max(0, num_children - len(brood.children))):
            brood.add(result, (best.id,))
        if brood.children:
            return brood
    brood.add(toolbox.merge_every_gain(best, breeding.scores), (best.id,))
    num_merges = num_children // CHILDREN_PER_MERGE
    # A merge can decline (b's gains in a already): twice as many trios as merges wanted.
    for a, b, base in toolbox.pairs_to_merge(breeding.scores, breeding.seed, 2 * num_merges):
        if len(brood.children) < num_merges:
            brood.add(toolbox.merge(a, b, base), (a.id, b.id))
    # All but one of the rest sweep on from the best program, GPU-only operators first,
    # then as the bandit ranks them (never-tried ones every other place): gains measured
    # on the seed do not carry over to a program 7x faster (the Triton norms were noise on
    # the eager seed and 1.11x on the prefill-graphs program,
    # docs/log/2026-11-23-why-search-stops-short-of-recipe.md); the other parents are mostly
    # far slower.
    for result in toolbox.sweep(best, num_children - len(brood.children) - 1):
        brood.add(result, (best.id,))
    for _ in range(MAX_DRAWS_PER_CHILD * num_children):
        if len(brood.children) >= num_children:
            break
        brood.add(*mutate_or_mate(breeding, parents))
    return brood


def best_of(hall_of_fame, seed: Program) -> Program:
    """The best confirmed program, or the seed before any."""
    return hall_of_fame[0] if len(hall_of_fame) else seed


def mutate_or_mate(breeding: Breeding, parents: list) -> tuple:
    """(child or Declined or Known, parent ids): crossover of two tournament winners at
    crossover_prob, else a mutation of one."""
    toolbox = breeding.toolbox
    pair = pick_two(toolbox, parents) if breeding.rng.random() < breeding.crossover_prob else None
    if pair:
        return toolbox.mate(*pair), (pair[0].id, pair[1].id)
    parent = toolbox.select_parents(parents, 1)[0]
    return toolbox.mutate(parent), (parent.id,)


def pick_two(toolbox, parents: list):
    """Two tournament winners with different sources, or None when there are no two."""
    first = toolbox.select_parents(parents, 1)[0]
    others = [p for p in parents if p.id != first.id]
    return (first, toolbox.select_parents(others, 1)[0]) if others else None
