"""The DEAP toolbox: what an individual is, and the algorithm's roles bound to their settings.

An individual is a `Program` (an engine's source and how it was made) with a creator
fitness: tokens/s (geometric mean over the judged cases) to maximise, and with --nsga2
peak memory to minimise as well. Unlike DEAP's list individuals, `mutate` and `mate`
return a new child (or the operator's `Declined`) instead of changing parents in place:
a program is its source, and sources are immutable.
"""
import random

from deap import base, creator, tools

from fitness.loader import source_hash

if not hasattr(creator, "FitnessSpeed"):
    creator.create("FitnessSpeed", base.Fitness, weights=(1.0,))
    creator.create("FitnessSpeedMemory", base.Fitness, weights=(1.0, -1.0))


class Program:
    """An engine's source and its origin; the creator types below add `fitness`."""

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


if not hasattr(creator, "Engine"):
    creator.create("Engine", Program, fitness=creator.FitnessSpeed)
    creator.create("EngineNSGA2", Program, fitness=creator.FitnessSpeedMemory)


def individual_type(nsga2: bool):
    return creator.EngineNSGA2 if nsga2 else creator.Engine


def default_mutate_fn(source, rng, device):
    import mutations  # lazily: the operators are another package, loaded when first needed
    return mutations.random_mutation(source, rng, device)


def default_mate_fn(a, b, rng):
    import mutations
    return mutations.crossover(a, b, rng)


def mutate(parent: Program, make, mutate_fn, rng: random.Random, device: str):
    """A child of one parent, or the operator's Declined."""
    result = mutate_fn(parent.source, rng, device)
    if not hasattr(result, "source"):
        return result
    return make(result.source, (parent.id,), result.operator, result.args)


def mate(a: Program, b: Program, make, mate_fn, rng: random.Random):
    """A child taking genes from two parents, or Declined."""
    result = mate_fn(a.source, b.source, rng)
    if not hasattr(result, "source"):
        return result
    return make(result.source, (a.id, b.id), result.operator, result.args)


def sel_elitist_tournament(individuals, k, hall_of_fame, num_elite, tournsize):
    """The best `num_elite` programs ever judged correct, then tournaments for the rest."""
    elites = [clone_of(best, individuals) for best in list(hall_of_fame)[:num_elite]]
    return elites + tools.selTournament(individuals, k - len(elites), tournsize)


def clone_of(program, individuals):
    """A population member with `program`'s source, or the hall-of-fame copy itself."""
    return next((ind for ind in individuals if ind.id == program.id), program)


def make_toolbox(config, hall_of_fame, evaluate, map_fn, rng: random.Random,
                 mutate_fn=default_mutate_fn, mate_fn=default_mate_fn) -> base.Toolbox:
    """The algorithm by role: each operation bound to its settings."""
    toolbox = base.Toolbox()
    toolbox.register("individual", individual_type(config.nsga2))
    toolbox.register("mutate", mutate, make=toolbox.individual, mutate_fn=mutate_fn, rng=rng,
                     device=config.device)
    toolbox.register("mate", mate, make=toolbox.individual, mate_fn=mate_fn, rng=rng)
    toolbox.register("select_parents", tools.selTournament, tournsize=config.tournament_size)
    if config.nsga2:
        toolbox.register("select", tools.selNSGA2)
    else:
        toolbox.register("select", sel_elitist_tournament, hall_of_fame=hall_of_fame,
                         num_elite=config.num_elite, tournsize=config.tournament_size)
    toolbox.register("evaluate", evaluate)
    toolbox.register("map", map_fn)
    return toolbox


def make_hall_of_fame(config) -> tools.HallOfFame:
    size = max(config.final_top, config.num_elite, config.seed_from_top)
    return tools.HallOfFame(size, similar=lambda a, b: a.id == b.id)


def make_statistics() -> tools.Statistics:
    import numpy as np

    stats = tools.Statistics(key=lambda ind: ind.fitness.values[0])
    stats.register("best", np.max)
    stats.register("median", np.median)
    return stats

