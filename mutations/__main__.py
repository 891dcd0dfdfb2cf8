"""python -m mutations list | apply OPERATOR SOURCE.py [--seed N] [-o OUT.py] | cross A.py B.py [--seed N] [-o OUT.py]
    | recipe RECIPE.txt [-o OUT.py] [--check-hash HASH]"""
import argparse
import json
import random
import sys
from pathlib import Path

import mutations
from contract.loader import source_hash
from mutations import recipe


def report(result, output) -> int:
    """Print what was done; write the child to `output` (stdout when None)."""
    if isinstance(result, mutations.Declined):
        print(f"declined: {result.operator}: {result.reason}", file=sys.stderr)
        return 1
    print(f"{result.operator} {json.dumps(result.args, sort_keys=True)}", file=sys.stderr)
    if output is None:
        sys.stdout.write(result.source)
    else:
        Path(output).write_text(result.source)
        print(f"wrote {output}", file=sys.stderr)
    return 0


def make_recipe(path: Path, output, check_hash) -> int:
    """Replay the recipe at `path` on the seed; 1 (naming the line) when a line declines."""
    try:
        source = recipe.apply(recipe.parse(path.read_text()), log=lambda line: print(line, file=sys.stderr))
    except recipe.RecipeError as err:
        print(f"{path}: {err}", file=sys.stderr)
        return 1
    made = source_hash(source)
    if check_hash and made != check_hash:
        print(f"{path}: the recipe makes {made}, not {check_hash}", file=sys.stderr)
        return 1
    return report(mutations.Applied(source, f"recipe {path.name}", {"candidate_id": made}), output)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutations", description="Try mutation operators by hand.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="one line per operator: name, kind, devices, description")
    apply = sub.add_parser("apply", help="apply one operator to a source file")
    apply.add_argument("operator")
    apply.add_argument("source", type=Path)
    cross = sub.add_parser("cross", help="cross two source files")
    cross.add_argument("a", type=Path)
    cross.add_argument("b", type=Path)
    for p in (apply, cross):
        p.add_argument("--seed", type=int, default=0)
    make = sub.add_parser("recipe", help="apply a recipe (one operator and its args a line) to the seed")
    make.add_argument("recipe", type=Path)
    make.add_argument("--check-hash", help="fail unless the result's source hash (candidate id) is this")
    for p in (apply, cross, make):
        p.add_argument("-o", "--output", type=Path)
    args = parser.parse_args(argv)
    if args.command == "recipe":
        return make_recipe(args.recipe, args.output, args.check_hash)
    if args.command == "list":
        for op in mutations.all_operators():
            print(f"{op.name:40s} {op.kind:10s} {op.devices:4s}  {op.description}")
        return 0
    rng = random.Random(args.seed)
    if args.command == "apply":
        try:
            op = mutations.get_operator(args.operator)
        except KeyError as err:
            print(err.args[0], file=sys.stderr)
            return 2
        return report(op.apply(args.source.read_text(), rng), args.output)
    return report(mutations.crossover(args.a.read_text(), args.b.read_text(), rng), args.output)


if __name__ == "__main__":
    sys.exit(main())
