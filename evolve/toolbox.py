"""The DEAP toolbox: what an individual is, and the algorithm's roles bound to their settings.

An individual is a `Program` (an engine's source and how it was made) with a creator
fitness: tokens/s (geometric mean over the judged cases) to maximise, and with --nsga2
peak memory to minimise as well. Unlike DEAP's list individuals, `mutate`, `sweep`,
`mate` and `merge` return new children (or the operator's `Declined`, or `Known` for a
child that is nothing new) instead of changing parents in place: a program is its source,
and sources are immutable. Which operator `mutate` applies is the bandit's choice
(`toolbox.selector`), taught by `learn`; `toolbox.memo` remembers what was bred.
"""
import importlib
import random

import numpy as np
from deap import base, creator, tools

import mutations
from contract.devices import is_cuda
from evolve.memo import Known, Memo
from evolve.merge import MERGE_EVERY_GAIN, merge, merge_every_gain, pairs_to_merge
from evolve.operators import DECLINED, DEMOTED, FAILED, LEVER, OperatorSelector, Vocabulary, outcome, sweep_rank
from evolve.program import Program, admitted, made
from evolve.stack import STACK, stack

if not hasattr(creator, "FitnessSpeed"):
    creator.create("FitnessSpeed", base.Fitness, weights=(1.0,))
    creator.create("FitnessSpeedMemory", base.Fitness, weights=(1.0, -1.0))

if not hasattr(creator, "Engine"):
    creator.create("Engine", Program, fitness=creator.FitnessSpeed)
    creator.create("EngineNSGA2", Program, fitness=creator.FitnessSpeedMemory)


def individual_type(nsga2: bool):
    return creator.EngineNSGA2 if nsga2 else creator.Engine


default_mutate_fn, default_mate_fn = mutations.random_mutation, mutations.crossover


def operator_module(mutate_fn):
    """The module whose operators the search draws from: the one defining `mutate_fn`
    (`mutations`, or MODULE of python -m evolve run --operators MODULE)."""
    return importlib.import_module(mutate_fn.__module__)


def mutate(parent: Program, make, vocabulary: Vocabulary, selector: OperatorSelector, memo: Memo,
           rng: random.Random, device: str):
    """A child of one parent by the operator the selector draws among those that apply to it
    and are not spent on it; Declined, or Known (also when every one is spent)."""
    if not vocabulary.can_choose:
        return admitted(vocabulary.random_mutation(parent.source, rng, device), (parent.id,), make, memo)
    names = open_operators(parent, vocabulary, memo, device)
    if not names:
        return Known("mutate", "every operator that applies was tried on this program")
    # Among operators never tried, the sweep's order: the GPU's large levers first.
    name = selector.choose(names, rng, rank=lambda n: sweep_rank(n, device, vocabulary))
    return apply_named(parent, name, make, vocabulary, selector, memo, rng)


def open_operators(parent: Program, vocabulary: Vocabulary, memo: Memo, device: str) -> list:
    """The operators that apply to `parent` and are not spent on it. On a GPU, those that put
    portable code where it runs a kernel only when nothing else is left: on a fast program
    they are losses (a search spent a third of its mutants of a 9x program on portable
    attentions and decode-only graphs, docs/log/2026-11-23-why-search-stops-short-of-recipe.md).
    Never a swap of a gene the target does not run (an MoE allele on a dense model: the child
    would be judged for nothing), nor one that cannot serve the target's family (prefill graphs
    on the hybrid: the child would crash)."""
    names = [n for n in vocabulary.applicable(parent.source, device)
             if not memo.is_spent(n, (parent.id,)) and vocabulary.gene_of(n) not in vocabulary.idle_genes
             and not set(vocabulary.cannot_serve(n)) & vocabulary.own_genes]
    if is_cuda(device):
        names = [n for n in names if not vocabulary.unports(n, parent.source)] or names
    return names


def sweep(parent: Program, limit: int, make, vocabulary: Vocabulary, selector: OperatorSelector, memo: Memo,
          rng: random.Random, device: str, levers_only: bool = False) -> list:
    """A child of `parent` by each of the first `limit` operators that apply to it and are
    not spent on it, each then spent on it, in `sweep_rank`'s order (swaps of the target's
    own genes, then GPU-only ones on a GPU; with `levers_only`, on a GPU, only those two, if
    any), then by the bandit's score, then at random; on a
    GPU, swaps that put portable code where a kernel runs only when nothing else is left.
    An operator with `sweep_places` takes up to that many places, a fresh draw in each.
    Operators the run never tried, the demoted aside, take every other place, or a short
    search re-sweeps the GPU-only ones on each new best and never tries the rest (it never
    tried `last_token_logits`: docs/log/2026-11-23-8-minute-search-adjacent-heads-fix.md).
    First of all (not among the levers), the next step of each move that made `parent`
    (`next_steps`: a constant doubled, doubled again): a search walks a constant that gained
    without drawing it again from ~60. [] when the vocabulary cannot name its operators."""
    if not vocabulary.can_choose:
        return []
    children = []
    for step in [] if levers_only else next_steps(parent, vocabulary, memo)[:limit]:
        child = memo.admit(make(step.source, (parent.id,), step.operator, step.args), False)
        children += [child] if isinstance(child, Program) else []  # taken before: its place goes on
    names = open_operators(parent, vocabulary, memo, device)
    ranks = {n: sweep_rank(n, device, vocabulary) for n in names}
    if levers_only and is_cuda(device):
        names = [n for n in names if ranks[n] <= LEVER] or names
    ranked = sorted(names, key=lambda n: (ranks[n], -selector.score(n), rng.random()))
    # Demoted operators stay last even untried: a CPU run's sweep put CUDA-graph decode
    # (0.14x there) second for being new.
    demoted = [n for n in ranked if ranks[n] == DEMOTED]
    untried = [n for n in ranked if n not in selector.tried and n not in demoted]
    tried = [n for n in ranked if n in selector.tried and n not in demoted]
    for name in alternate(untried, tried) + demoted:
        if len(children) == limit:
            break
        # An operator with several places draws again until they are used or it repeats itself.
        for _ in range(vocabulary.sweep_places(name)):
            children.append(apply_named(parent, name, make, vocabulary, selector, memo, rng))
            if not made(children[-1]) or len(children) == limit:
                break
        memo.spend(name, (parent.id,))  # once per program: a rewrite's other draws are the bandit's
    return children


def stack_levers(parent: Program, make, vocabulary: Vocabulary, memo: Memo, rng: random.Random, device: str):
    """On a GPU, one child of `parent` with every operator open on it stacked (evolve/stack.py);
    elsewhere, or for a vocabulary that cannot name its operators or their genes, None. Else
    Declined, or Known."""
    if not (is_cuda(device) and vocabulary.can_choose and vocabulary.intended_genes):
        return None
    names = open_operators(parent, vocabulary, memo, device)
    return admitted(stack(parent.source, names, vocabulary, device, rng), (parent.id,), make, memo)


def next_steps(parent: Program, vocabulary: Vocabulary, memo: Memo) -> list:
    """The moves that made `parent` (its own, or each gain a fold of gains carries) made once
    more on it, where they have a next step (Operator.extend)."""
    movers = [parent]
    if parent.operator == MERGE_EVERY_GAIN:
        movers = [memo.program(pid) for pid in parent.operator_args.get("merged", ())]
    steps = [vocabulary.extend(mover, parent.source) for mover in movers if mover is not None]
    return [step for step in steps if made(step)]


def alternate(first: list, second: list) -> list:
    """first[0], second[0], first[1], second[1], ...; the longer one's rest at the end."""
    merged = [n for pair in zip(first, second) for n in pair]
    shorter = min(len(first), len(second))
    return merged + first[shorter:] + second[shorter:]


def apply_named(parent: Program, name: str, make, vocabulary: Vocabulary, selector: OperatorSelector,
                memo: Memo, rng: random.Random):
    result = vocabulary.apply(name, parent.source, rng)
    if not made(result):  # declined: credited now, and not drawn for this parent again
        selector.reward(name, DECLINED)
        memo.spend(name, (parent.id,))
        return result
    child = make(result.source, (parent.id,), result.operator, result.args)
    return memo.admit(child, vocabulary.is_deterministic(name))


def mate(a: Program, b: Program, make, mate_fn, memo: Memo, rng: random.Random):
    """A child taking genes from two parents; Declined, or Known."""
    return admitted(mate_fn(a.source, b.source, rng), (a.id, b.id), make, memo)


def learn(offspring: list, scores, selector: OperatorSelector, memo: Memo) -> None:
    """Credit the operator of each judged mutant (and of each child found to be a known
    program) with its outcome against the parent; a failure also spends the operator on
    that parent."""
    memo.see(offspring)
    made = [(c.operator, c.id, c.parent_ids) for c in offspring] + memo.take_twins()
    for operator, child_id, parent_ids in made:
        if len(parent_ids) != 1 or operator == STACK:
            continue  # the seed, --seed-from programs, crossovers, merges and stacks: no operator drawn
        result = outcome(scores, child_id, parent_ids[0])
        if result is None:
            continue  # not judged (the budget ran out)
        selector.reward(operator, result)
        if result == FAILED:
            memo.spend(operator, parent_ids)


def sel_elitist_tournament(individuals, k, hall_of_fame, num_elite, tournsize):
    """The best `num_elite` programs ever judged correct, then tournaments for the rest."""
    elites = [clone_of(best, individuals) for best in list(hall_of_fame)[:num_elite]]
    return elites + tools.selTournament(individuals, k - len(elites), tournsize)


def clone_of(program, individuals):
    """A population member with `program`'s source, or the hall-of-fame copy itself."""
    return next((ind for ind in individuals if ind.id == program.id), program)


def make_toolbox(config, hall_of_fame, evaluate, map_fn, rng: random.Random,
                 mutate_fn=default_mutate_fn, mate_fn=default_mate_fn, idle_genes=frozenset(),
                 own_genes=frozenset(), memo: Memo | None = None) -> base.Toolbox:
    """The algorithm by role: each operation bound to its settings; `idle_genes`, genes the
    target never runs, are never swapped; `own_genes`, those its family brings, are swept first."""
    toolbox = base.Toolbox()
    toolbox.register("individual", individual_type(config.nsga2))
    toolbox.selector, toolbox.memo = OperatorSelector(), memo or Memo()  # the search's learning: plain state
    vocabulary = Vocabulary(operator_module(mutate_fn), mutate_fn, mate_fn, idle_genes, own_genes)
    breeding = {"make": toolbox.individual, "vocabulary": vocabulary, "memo": toolbox.memo, "rng": rng}
    toolbox.register("mutate", mutate, **breeding, selector=toolbox.selector, device=config.device)
    toolbox.register("sweep", sweep, **breeding, selector=toolbox.selector, device=config.device)
    toolbox.register("stack", stack_levers, **breeding, device=config.device)
    toolbox.register("mate", mate, make=toolbox.individual, mate_fn=mate_fn, memo=toolbox.memo, rng=rng)
    toolbox.register("merge", merge, **breeding)
    toolbox.register("merge_every_gain", merge_every_gain, make=breeding["make"], vocabulary=breeding["vocabulary"],
                     memo=toolbox.memo, rng=rng)
    toolbox.register("pairs_to_merge", pairs_to_merge, vocabulary=vocabulary, memo=toolbox.memo)
    toolbox.register("learn", learn, selector=toolbox.selector, memo=toolbox.memo)
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
    stats = tools.Statistics(key=lambda ind: ind.fitness.values[0])
    stats.register("best", np.max)
    stats.register("median", np.median)
    return stats

