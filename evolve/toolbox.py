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
from dataclasses import dataclass, field

import numpy as np
from deap import base, creator, tools

import mutations
from contract.loader import source_hash
from evolve.memo import MERGE, MERGE_DECLINED, Known, Memo
from evolve.operators import (DECLINED, DEMOTED, FAILED, OperatorSelector, Vocabulary, gain_pairs,
                              outcome, sweep_rank)

MERGE_EVERY_GAIN = "merge_every_gain"

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


def made(result) -> bool:
    """Whether an operator's result is a program (Applied, or a Program already admitted),
    not a Declined or a Known child."""
    return isinstance(result, (mutations.Applied, Program))


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
    attentions and decode-only graphs, docs/PERF.md). Never a swap of a gene the target does not
    run (an MoE allele on a dense model: the child would be judged for nothing)."""
    names = [n for n in vocabulary.applicable(parent.source, device)
             if not memo.is_spent(n, (parent.id,)) and vocabulary.gene_of(n) not in vocabulary.idle_genes]
    if str(device).startswith("cuda"):
        names = [n for n in names if not vocabulary.unports(n, parent.source)] or names
    return names


def sweep(parent: Program, limit: int, make, vocabulary: Vocabulary, selector: OperatorSelector, memo: Memo,
          rng: random.Random, device: str, levers_only: bool = False) -> list:
    """A child of `parent` by each of the first `limit` operators that apply to it and are
    not spent on it, each then spent on it: GPU-only ones first on a GPU (with
    `levers_only`, only those, if any), then by the bandit's score, then at random; on a
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
    if levers_only and 0 in ranks.values():
        names = [n for n in names if ranks[n] == 0]
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


def merge(a: Program, b: Program, base: Program, make, vocabulary: Vocabulary, memo: Memo, rng: random.Random):
    """`a` with the genes `b`'s mutations meant to change since `base`, less those `a`'s
    meant to change (a is the faster: its genes stay); Declined, or Known. Tried once per
    trio."""
    memo.spend(MERGE, (a.id, b.id, base.id))
    genes = intent_since(b, base, memo, vocabulary)
    if genes:
        genes -= intent_since(a, base, memo, vocabulary)
        result = vocabulary.merge(a.source, b.source, base.source, rng, genes) if genes else \
            mutations.Declined("merge_gains", f"{a.id} changed every gene {b.id} meant to change")
    else:  # b's lineage unknown: every gene it differs in
        result = vocabulary.merge(a.source, b.source, base.source, rng)
    if not made(result):
        memo.spend(MERGE_DECLINED, (a.id, b.id))  # nor into a's descendants
    return admitted(result, (a.id, b.id), make, memo, {"base": base.id})


def merge_every_gain(best: Program, scores, make, vocabulary: Vocabulary, memo: Memo, rng: random.Random):
    """One child: `best` with the gains of every correct program that may have beaten its
    own parent (`gains_to_merge`), merged weakest first (`fold_in`). The child is judged
    beside `best`, so gains inside a screen's noise count: the recipe's lead over an
    8-minute search's best was gains of 2-10% each (docs/PERF.md). `best`'s own gain counts
    too, or a fold over it could undo it (a 2x decode-graphs gain folded over a 5.7x
    prefill-graphs best drew 0.53x of it).
    A program-wide rewrite's gain (every kernel under PDL) is its operator applied again to
    the fold, last. Pair merges combine two gains a generation; a sweep finds many at once.
    Declined when nothing new comes of it, or Known."""
    if vocabulary.merge_gains is None:
        return mutations.Declined(MERGE_EVERY_GAIN, "the operators cannot merge")
    gains = gains_to_merge(scores, memo)
    # A program-wide rewrite touches every gene with a kernel or a matmul, so stronger gains
    # would own its genes and a fold by genes drop it (prefetched_linears, 1.01x, was lost
    # so): it is applied again at the end.
    wide = [g for g in gains if vocabulary.is_program_wide(g[1].operator)]
    by_gene = [g for g in gains if not vocabulary.is_program_wide(g[1].operator)]
    owner = gene_owners(by_gene, vocabulary)
    fold = Fold(best.source)
    for _, program, parent in by_gene:
        fold_in(fold, program, parent, owner, vocabulary, rng)
    for _, program, _ in wide:
        fold.take_if_new(vocabulary.reapply(program, fold.source, rng), program)
    merged = [pid for pid in fold.merged if pid != best.id]
    if not merged or fold.source == best.source:
        return mutations.Declined(MERGE_EVERY_GAIN, f"no gain that {best.id} lacks")
    child = mutations.Applied(fold.source, MERGE_EVERY_GAIN, {"merged": merged})
    return admitted(child, (best.id, merged[-1]), make, memo)


@dataclass
class Fold:
    """merge_every_gain's child as gains are folded into it, and the ids of those it carries."""
    source: str
    merged: list = field(default_factory=list)

    def take(self, source: str, program_id: str, displaced: bool = False) -> None:
        """`source` now, carrying `program_id`'s gain (and, when `displaced`, none before)."""
        self.source, self.merged = source, ([] if displaced else self.merged) + [program_id]

    def take_if_new(self, result, program: Program) -> None:
        """An operator's result, when it applied and changed the fold."""
        if made(result) and result.source != self.source:
            self.take(result.source, program.id)


def fold_in(fold: Fold, program: Program, parent: Program, owner: dict, vocabulary: Vocabulary,
            rng: random.Random) -> None:
    """One gain into the fold, by the genes its operator meant to change (`intended`). A gain
    made on what the fold still is comes whole: nothing was added yet."""
    intended = vocabulary.intended(program, parent)
    is_on_fold = fold.source == parent.source
    if intended is None:  # its operator cannot say: every gene it differs in
        if is_on_fold:
            fold.take(program.source, program.id)
        else:
            merge_genes(fold, program, parent, None, vocabulary, rng)
    elif not intended:  # no gene changed (a constant tuned, as PAGE_SIZE 32): nothing to take
        if is_on_fold:  # by genes; its operator is applied again, with its args
            fold.take(program.source, program.id)
        else:
            fold.take_if_new(vocabulary.replay(program, fold.source), program)
    else:  # only the genes no stronger gain changes: where two changed one, the stronger stays
        owned = {gene for gene in intended if owner[gene] == program.id}
        if is_on_fold and owned == intended:
            fold.take(program.source, program.id)
        elif owned:
            merge_genes(fold, program, parent, owned, vocabulary, rng)


def merge_genes(fold: Fold, program: Program, parent: Program, genes: set | None, vocabulary: Vocabulary,
                rng: random.Random) -> None:
    """`genes` of `program` (None: every one it differs in) merged into the fold. A stronger
    gain whose requirements take back a weaker one's genes displaces it whole (fused_both at
    1.12x was lost to fuse_linears at 1.02x, its merge declined as a copy)."""
    result = vocabulary.merge(fold.source, program.source, parent.source, rng, genes, b_whole=True)
    if made(result):
        fold.take(result.source, program.id, displaced=result.source == program.source)


def gains_to_merge(scores, memo: Memo) -> list:
    """(ratio, program, parent) of every mutant the run bred that may be faster than its
    parent, weakest first: by the fitted speeds, or inside a paired comparison's interval
    (small gains are screened within their parent's noise, some below 1.0x: a search that
    took only clear ones merged none of four, docs/PERF.md)."""
    gains = []
    for program in memo.programs.values():
        parent = memo.program(program.parent_ids[0]) if len(program.parent_ids) == 1 else None
        if parent is not None and scores.could_be_a_gain(program.id, parent.id):
            gains.append((scores.gain(program.id, parent.id), program, parent))
    return sorted(gains, key=lambda g: (g[0], g[1].id))


def gene_owners(gains: list, vocabulary: Vocabulary) -> dict:
    """gene -> the id of the gain whose version of it a fold of `gains` ((ratio, program,
    parent), weakest first) takes: the strongest that meant to change it (a weaker gain's
    gene, later overwritten, could still have dragged its requirements along), unless a
    gain made on a program already carrying that version refines it, the strongest such
    (`last_token_logits` made on the best changes the Engine gene that prefill graphs
    owned: by the first rule alone it was never merged)."""
    owner, by_id = {}, {}
    for _, program, parent in gains:
        by_id[program.id] = program
        for gene in vocabulary.intended(program, parent) or ():
            owner[gene] = program.id
    refined = {}
    for _, program, parent in gains:
        for gene in vocabulary.intended(program, parent) or ():
            first = by_id[owner[gene]]
            if first is not program and gene not in vocabulary.differing(parent, first):
                refined[gene] = program.id
    return {**owner, **refined}


def admitted(result, parent_ids: tuple, make, memo: Memo, extra_args=None):
    """The operator's child, unless the memo knows it; its Declined as it is."""
    if not made(result):
        return result
    return memo.admit(make(result.source, parent_ids, result.operator, {**result.args, **(extra_args or {})}))


def intent_since(program: Program, base: Program, memo: Memo, vocabulary: Vocabulary) -> set:
    """The genes the mutations of `program`'s lineage since `base` meant to change (empty
    when the vocabulary cannot say or the lineage is unknown)."""
    genes = set()
    for mutant, parent in memo.mutations_since(program.id, base.id):
        genes |= (vocabulary.intended(mutant, parent) or set()) if parent is not None else set()
    return genes


def pairs_to_merge(scores, seed: Program, limit: int, vocabulary: Vocabulary, memo: Memo) -> list:
    """(a, b, base) trios whose gains `merge` may combine; none when the vocabulary cannot."""
    if vocabulary.merge_gains is None or limit < 1:
        return []
    return gain_pairs(list(memo.programs.values()), scores, memo, seed, limit)


def learn(offspring: list, scores, selector: OperatorSelector, memo: Memo) -> None:
    """Credit the operator of each judged mutant (and of each child found to be a known
    program) with its outcome against the parent; a failure also spends the operator on
    that parent."""
    memo.see(offspring)
    made = [(c.operator, c.id, c.parent_ids) for c in offspring] + memo.take_twins()
    for operator, child_id, parent_ids in made:
        if len(parent_ids) != 1:
            continue  # the seed, --seed-from programs, crossovers and merges: no operator drawn
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
                 mutate_fn=default_mutate_fn, mate_fn=default_mate_fn, idle_genes=frozenset()) -> base.Toolbox:
    """The algorithm by role: each operation bound to its settings; `idle_genes`, genes the
    target never runs, are never swapped."""
    toolbox = base.Toolbox()
    toolbox.register("individual", individual_type(config.nsga2))
    toolbox.selector, toolbox.memo = OperatorSelector(), Memo()  # the search's learning: plain state
    vocabulary = Vocabulary(operator_module(mutate_fn), mutate_fn, mate_fn, idle_genes)
    breeding = {"make": toolbox.individual, "vocabulary": vocabulary, "memo": toolbox.memo, "rng": rng}
    toolbox.register("mutate", mutate, **breeding, selector=toolbox.selector, device=config.device)
    toolbox.register("sweep", sweep, **breeding, selector=toolbox.selector, device=config.device)
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

