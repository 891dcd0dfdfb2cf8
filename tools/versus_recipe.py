"""Per case, an engine's tokens/s over the recipe's, from `python -m fitness bench` results
saved as DIR/ROUND.ENGINE.json (ENGINE: "winner", "recipe", ...): the ratio in each round,
their median and ~95% interval, and the geometric mean over the cases of the medians.
`--decided` exits 1 while a case's interval neither excludes 1 nor is within +-2% (the
judge's rule, fitness/timing.py), so a driver can bench more rounds until it does.

    python -m tools.versus_recipe DIR [--engine winner] [--baseline recipe] [--decided]
"""
import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from fitness.timing import is_decided, ratio_interval


def tokens_per_second(path: Path) -> dict:
    return {r["case_name"]: r["tokens_per_second"] for r in json.loads(path.read_text())}


def ratios(folder: Path, engine: str, baseline: str) -> dict:
    """case -> [ratio of each round where both were benched]; a round where either run
    failed (its file empty) is left out, and said so."""
    found = {}
    for ours in sorted(folder.glob(f"*.{engine}.json")):
        theirs = ours.with_name(ours.name.replace(f".{engine}.json", f".{baseline}.json"))
        if theirs.is_file():
            if not (ours.stat().st_size and theirs.stat().st_size):
                print(f"{ours.name.split('.')[0]}: left out, a run failed (an empty result)", file=sys.stderr)
                continue
            base = tokens_per_second(theirs)
            for case, tps in tokens_per_second(ours).items():
                found.setdefault(case, []).append(tps / base[case])
    return found


def interval(values: list) -> tuple:
    """~95% interval of the geometric mean of the ratios (the judge's, fitness.timing)."""
    _, low, high = ratio_interval([math.log(v) for v in values])
    return low, high


def decided(values: list) -> bool:
    """The judge's rule: two rounds or more, and the interval excludes 1 or is within +-2%."""
    return len(values) >= 2 and is_decided(*interval(values))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--engine", default="winner")
    parser.add_argument("--baseline", default="recipe")
    parser.add_argument("--decided", action="store_true", help="exit 1 while a case is undecided")
    args = parser.parse_args(argv)
    per_case = ratios(args.folder, args.engine, args.baseline)
    if not per_case:
        raise SystemExit(f"no rounds with both {args.engine} and {args.baseline} in {args.folder}")
    medians = {case: statistics.median(values) for case, values in per_case.items()}
    for case, values in per_case.items():
        low, high = interval(values)
        print(f"{case:>20}: {' / '.join(f'{v:.2f}' for v in values)}  median {medians[case]:.3f}"
              f"  ~95% {low:.3f}-{high:.3f}{'' if decided(values) else ' (undecided)'}")
    mean = math.exp(sum(map(math.log, medians.values())) / len(medians))
    print(f"{args.engine} / {args.baseline}: geometric mean of the medians {mean:.3f}, "
          f"lowest case {min(medians.values()):.3f}")
    if args.decided and not all(map(decided, per_case.values())):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
