"""Per case, an engine's tokens/s over the recipe's, from `python -m fitness bench` results
saved as DIR/ROUND.ENGINE.json (ENGINE: "winner", "recipe", ...): the ratio in each round,
their median, and the geometric mean over the cases of the medians.

    python -m tools.versus_recipe DIR [--engine winner] [--baseline recipe]
"""
import argparse
import json
import math
import statistics
from pathlib import Path


def tokens_per_second(path: Path) -> dict:
    return {r["case_name"]: r["tokens_per_second"] for r in json.loads(path.read_text())}


def ratios(folder: Path, engine: str, baseline: str) -> dict:
    """case -> [ratio of each round where both were benched]."""
    found = {}
    for ours in sorted(folder.glob(f"*.{engine}.json")):
        theirs = ours.with_name(ours.name.replace(f".{engine}.json", f".{baseline}.json"))
        if theirs.is_file():
            base = tokens_per_second(theirs)
            for case, tps in tokens_per_second(ours).items():
                found.setdefault(case, []).append(tps / base[case])
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--engine", default="winner")
    parser.add_argument("--baseline", default="recipe")
    args = parser.parse_args(argv)
    per_case = ratios(args.folder, args.engine, args.baseline)
    if not per_case:
        raise SystemExit(f"no rounds with both {args.engine} and {args.baseline} in {args.folder}")
    medians = {case: statistics.median(values) for case, values in per_case.items()}
    for case, values in per_case.items():
        print(f"{case:>20}: {' / '.join(f'{v:.2f}' for v in values)}  median {medians[case]:.3f}")
    mean = math.exp(sum(map(math.log, medians.values())) / len(medians))
    print(f"{args.engine} / {args.baseline}: geometric mean of the medians {mean:.3f}, "
          f"lowest case {min(medians.values()):.3f}")


if __name__ == "__main__":
    main()
