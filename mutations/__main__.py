"""python -m mutations list | apply OPERATOR SOURCE.py [--seed N] [-o OUT.py] | cross A.py B.py [--seed N] [-o OUT.py]"""
import argparse
import json
import random
import sys
from pathlib import Path

import mutations


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
        p.add_argument("-o", "--output", type=Path)
    args = parser.parse_args(argv)
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
