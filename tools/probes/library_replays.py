"""What replaying the library costs a run's start, and the seeds no recipe makes.

    python -m tools.probes.library_replays [--device cuda]     (twice: replayed, then read back)
    python -m tools.probes.library_replays --edited-seeds DIR  (DIR/one_kernel.py, DIR/every_kernel.py)

The first times `library.seed_programs` for the public target in a fresh process and names
the programs it took (a run on a GPU replays four recipes; mutations.replay_cache keeps them).
The second writes `fastest.txt`'s program with a comment as the first line of the body of
`prefetched_linear_kernel`, or of every `@triton.jit` function: a key Triton has not seen and a
source no recipe makes, for `bash run.sh --seed-from` (docs/log/2026-12-01-seed-from-compile-cost.md).
"""
import argparse
import re
import time
from pathlib import Path

from contract.devices import resolve_device
from contract.loader import SEED_ENGINE, source_hash
from evolve import library
from evolve.config import RunConfig
from mutations import recipe, replay_cache

TARGET = Path(__file__).resolve().parents[2] / "target"
EDIT = "    # edited by hand (a key Triton has not seen)"


def time_replays(device: str) -> None:
    config = RunConfig.build(resolve_device(device), model_config=TARGET / "model_config.json",
                             weight_dir=TARGET / "weights")
    started = time.monotonic()
    taken, declined = library.seed_programs(config, SEED_ENGINE.read_text())
    print(f"library.seed_programs {time.monotonic() - started:.1f} s on {config.device}: {len(taken)} taken "
          f"{[source_hash(source) for source, _ in taken]}, {len(declined)} declined; replays kept in "
          f"{replay_cache.folder()}")


def with_comment(source: str, kernel: str | None) -> str:
    """`source` with EDIT as the first body line of `kernel` (every @triton.jit function if None)."""
    lines, out, i = source.split("\n"), [], 0
    while i < len(lines):
        out.append(lines[i])
        if lines[i].startswith("@triton.jit"):
            i += 1
            name = re.match(r"def (\w+)", lines[i]).group(1)
            while not lines[i].rstrip().endswith(":"):  # the signature's last line
                out.append(lines[i])
                i += 1
            out.append(lines[i])
            if kernel in (None, name):
                out.append(EDIT)
        i += 1
    return "\n".join(out)


def write_edited(folder: Path) -> None:
    program = recipe.apply(recipe.parse(library.RECIPE.read_text()))
    folder.mkdir(parents=True, exist_ok=True)
    for name, kernel in (("one_kernel", "prefetched_linear_kernel"), ("every_kernel", None)):
        edited = with_comment(program, kernel)
        (folder / f"{name}.py").write_text(edited)
        print(f"{folder / name}.py: {edited.count(EDIT)} kernel(s) edited, {source_hash(edited)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--edited-seeds", type=Path, help="write the two seeds here instead")
    args = parser.parse_args()
    if args.edited_seeds:
        write_edited(args.edited_seeds)
    else:
        time_replays(args.device)


if __name__ == "__main__":
    main()
