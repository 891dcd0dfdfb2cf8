"""The stack: one child with every step a sweep would take, each on the program the last made.

On a real shape a screen costs minutes: 86-197 s on 4 layers of Qwen3-30B-A3B's width, so a
20-minute search from the seed on two H200s screened 10 children of one step each and
returned 0.27x the program composed by hand in 17 steps. Some steps also pay only together:
the graphs capture the MoE only once it reads nothing back to the host
(docs/log/2026-11-30-moe-search-two-gpus-batch-1-timeline.md). So on a GPU, generation 1's
sweep of a program that lacks several levers begins with their stack:

- every operator the sweep may take, in its order (the target family's own genes, the GPU's
  levers, the rest), kernels before portable code within each, ties drawn from the rng;
- each applied to the program the last one made, and left out where it would swap the
  allele of a gene an earlier step meant to change (not one it only repaired: a later swap's
  requirements may settle that one anew): a gene is kept by its first taker, and a rewrite
  (last-token logits) refines the allele there;
- the program-wide rewrites (every kernel under PDL, every small matmul) last, on the
  kernels the others brought.

Operators that draw a move (a constant, a pair of linears) are left to the sweep: one draw
of many says little. The stack is screened beside the singles, which measure each step
alone; merges and later sweeps go on from whichever is best. With it first, the same search
returned 1.009x the hand-composed program: the stack and one constant
(docs/log/2026-11-30-moe-search-stack-meets-hand.md).
"""
import random

import mutations
from evolve.operators import DEMOTED, LEVER, sweep_rank
from evolve.program import made
from mutations import alleles, program
from mutations.recipe import RecipeStep, unmatched

STACK = "stack"
# A program lacking levers in fewer genes than this is swept one step at a time.
MIN_LEVERS = 2


def stack(source: str, names: list, vocabulary, device: str, rng: random.Random):
    """Applied (operator STACK, args {"steps": its recipe lines, in order}) or Declined:
    every operator of `names` (those open on the program `source`) stacked as above."""
    ranks = {name: sweep_rank(name, device, vocabulary) for name in names}
    taken = kernel_genes(source)  # a kernel the program runs is kept: another is the sweep's to try
    lever_genes = {vocabulary.gene_of(n) or n for n in names if ranks[n] <= LEVER} - taken
    if len(lever_genes) < MIN_LEVERS:
        return mutations.Declined(STACK, f"levers open in {len(lever_genes)} gene(s): the sweep takes them one at a time")
    stackable = [n for n in names if ranks[n] < DEMOTED and not vocabulary.draws(n) and not vocabulary.is_program_wide(n)]
    order = sorted(stackable, key=lambda n: (ranks[n], vocabulary.devices_of(n) != "cuda", rng.random()))
    steps = []
    for name in order:
        result = vocabulary.apply(name, source, rng)
        if not made(result) or vocabulary.unports(name, source) \
                or set(unmatched(source, program.gene_alleles(program.parse(result.source)))) & taken:
            continue  # it would swap a gene an earlier step chose
        taken |= vocabulary.intended_genes(result.source, source, result.args)
        source = result.source
        steps.append(RecipeStep(result.operator, result.args).line())
    for op in mutations.all_operators():  # each declines where it does not apply
        if op.program_wide and op.can_run_on(device) and sweep_rank(op.name, device, vocabulary) < DEMOTED:
            result = vocabulary.apply(op.name, source, rng)
            if made(result):
                source = result.source
                steps.append(RecipeStep(result.operator, result.args).line())
    if len(steps) < MIN_LEVERS:
        return mutations.Declined(STACK, f"{len(steps)} step(s) applied: no stack")
    return mutations.Applied(source, STACK, {"steps": steps})


def kernel_genes(source: str) -> set:
    """The genes whose allele in `source` runs only on a GPU."""
    carried = program.gene_alleles(program.parse(source))
    return {gene for gene, name in carried.items() if getattr(alleles.get(gene, name), "devices", "any") == "cuda"}
