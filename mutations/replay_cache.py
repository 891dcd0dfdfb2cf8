"""Recipes replayed once a machine: the program a recipe makes, kept on disk.

A replay is a pure function of the steps, the source they start from and the code that
replays them (this package, libcst, Python's version), so all of those make the key. A GPU
host spent ~27 s of each run's start replaying the library's recipes
(docs/log/2026-12-01-seed-from-compile-cost.md); the second run on it reads them.

The folder is $EVOLVE_REPLAY_CACHE, else ~/.cache/engine-evolver/replays ($XDG_CACHE_HOME's);
EVOLVE_REPLAY_CACHE="" replays every time. Nothing is evicted (a program is ~130 KB, and a
run takes four or five; a change to this package keys them anew). A runner closed off
(fitness/isolation.py) cannot write it; where one is left open it could, as it could the
recipes themselves.
"""
import hashlib
import importlib.metadata
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from mutations import recipe

PACKAGE = Path(__file__).resolve().parent


def folder() -> Path | None:
    """Where replays are kept; None when they are not."""
    given = os.environ.get("EVOLVE_REPLAY_CACHE")
    if given is not None:
        return Path(given) if given else None
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(home) / "engine-evolver" / "replays"


@lru_cache(maxsize=1)
def code_key() -> str:
    """The replaying code: every file of this package, libcst's version, Python's."""
    digest = hashlib.sha256(f"{sys.version_info[:2]} libcst {importlib.metadata.version('libcst')}".encode())
    for path in sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def key(steps: list, source: str) -> str:
    text = "\n".join([code_key(), hashlib.sha256(source.encode()).hexdigest(), *(s.line() for s in steps)])
    return hashlib.sha256(text.encode()).hexdigest()


def apply(steps: list, source: str) -> str:
    """recipe.apply(steps, source), read from the folder when this code made it before. A
    recipe that declines is replayed each time (its RecipeError names the line)."""
    where = folder()
    path = where / f"{key(steps, source)}.py" if where else None
    if path is not None and path.is_file():
        return path.read_text()
    made = recipe.apply(steps, source)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
                f.write(made)
            os.replace(f.name, path)  # whole or not at all: two runs may write one key at once
        except OSError:  # a read-only home: replayed again next time, nothing lost
            pass
    return made
