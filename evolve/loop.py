"""The generation loop: breed, judge, score, select, remember, report, checkpoint.

Generation 0 judges the first population (the seed and --seed-from programs); every
later one breeds as many children as the population holds.
"""
import time

from evolve.judging import judge_unjudged
from evolve.toolbox import Program


def evolve(search) -> None:
    """Generations until the count or the budget runs out (DESIGN.md, "The search")."""
    toolbox, config = search.toolbox, search.config
    while search.should_continue():
        gen, started = search.generation, time.monotonic()
        # Breed: children of tournament-chosen parents, by crossover or by mutation.
        if gen == 0:
            offspring, parents, num_declined = search.population, [], 0
        else:
            parents = search.population
            offspring, num_declined = breed(search, parents, config.population)
        # Judge each new source once and re-time the elite, all in one parallel map.
        num_cached = sum(p.id in search.scores for p in offspring)
        new, _ = judge_unjudged(toolbox, search.scores, gen, offspring, remeasure=search.elite())
        # Score: a program's fitness is the mean of its measurements so far.
        search.assign_fitness(parents + offspring + list(search.hall_of_fame))
        # Remember: the hall of fame, and the best correct program in workspace/engine.py.
        search.update_best(parents + offspring)
        # Select: the elite kept, tournaments for the rest (or NSGA-II on both objectives).
        search.population = toolbox.select(parents + offspring, config.population)
        # Report and checkpoint: one record for the console, results.log and the logbook.
        search.finish_generation(new, num_cached, num_declined, time.monotonic() - started)


def breed(search, parents: list, num_children: int) -> tuple[list, int]:
    """`num_children` children (fewer if operators keep declining) and how many declined."""
    toolbox, rng = search.toolbox, search.rng
    children, num_declined = [], 0
    for _ in range(3 * num_children):
        if len(children) == num_children:
            break
        pair = pick_two(toolbox, parents) if rng.random() < search.config.crossover_prob else None
        if pair:
            child, parent_ids = toolbox.mate(*pair), (pair[0].id, pair[1].id)
        else:
            parent = toolbox.select_parents(parents, 1)[0]
            child, parent_ids = toolbox.mutate(parent), (parent.id,)
        if isinstance(child, Program):
            children.append(child)
        else:
            num_declined += 1
            search.record_decline(child, parent_ids)
    return children, num_declined


def pick_two(toolbox, parents: list):
    """Two tournament winners with different sources, or None when there are no two."""
    first = toolbox.select_parents(parents, 1)[0]
    others = [p for p in parents if p.id != first.id]
    return (first, toolbox.select_parents(others, 1)[0]) if others else None
