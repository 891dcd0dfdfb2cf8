"""What generation 1's stack (evolve/stack.py) makes of the seed for a target, against a recipe.

    python -m tools.stack_vs_recipe (--model-config C | --shape NAME) --recipe R [--rng 0 1] [--out DIR]

NAME: a shape of target.hf_checkpoints (qwen3_30b_a3b, qwen3_5_35b_a3b, llama_3_2_1b, ...),
its config alone (no weights are made).

Breeding only (libcst, ~30 s a stack on 2 cores); nothing is judged. For each rng seed it prints
the stack's steps and every gene the target runs whose allele differs from the recipe's program;
with --out, it writes each stack's program to DIR/stack_rng{N}.py (to be judged or benched on a GPU).
"""
import argparse
import random
from pathlib import Path

import mutations
from contract.families import idle_genes, own_genes
from contract.model_config import ModelConfig
from evolve.library import steps_of
from evolve.memo import Memo
from evolve.operators import Vocabulary
from evolve.program import Program
from evolve.stack import stack
from evolve.toolbox import open_operators
from mutations import program, recipe
from target.hf_checkpoints import CHECKPOINTS


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model-config", help="a config file, or a Hugging Face model directory")
    target.add_argument("--shape", choices=sorted(CHECKPOINTS))
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--rng", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, help="a folder for each stack's program")
    args = parser.parse_args(argv)
    config = ModelConfig.from_dict(dict(CHECKPOINTS[args.shape])) if args.shape else ModelConfig.load(args.model_config)
    idle = idle_genes(config)
    vocabulary = Vocabulary(mutations, mutations.random_mutation, mutations.crossover, idle, own_genes(config))
    seed = Program(program.SEED_PATH.read_text())
    names = open_operators(seed, vocabulary, Memo(), "cuda")
    wanted = program.gene_alleles(program.parse(recipe.apply(recipe.parse(open(args.recipe).read()))))
    for rng in args.rng:
        made = stack(seed.source, names, vocabulary, "cuda", random.Random(rng))
        if not isinstance(made, mutations.Applied):
            print(f"rng {rng}: {made.reason}")
            continue
        got = program.gene_alleles(program.parse(made.source))
        differ = {g: (got.get(g), wanted.get(g)) for g in sorted(set(got) | set(wanted))
                  if got.get(g) != wanted.get(g) and g not in idle}
        print(f"rng {rng}: {len(made.args['steps'])} steps: {', '.join(s.operator for s in steps_of(made.args))}")
        print(f"  genes whose allele differs (stack, recipe): {differ or 'none'}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"stack_rng{rng}.py").write_text(made.source)


if __name__ == "__main__":
    main()
