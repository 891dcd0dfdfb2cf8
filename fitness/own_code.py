"""The code that judges, held to what it was before any candidate ran.

A candidate runs as its judge's user and can rewrite any file that user can. A process the
judge starts later (a runner started ahead to time the next baseline in, a judge started
again after one was killed) imports what it wrote: a runner.py that sleeps in every call
of a program other than the cheat's slows its baselines. So the files those processes
import, the repository's packages and the installed ones they use (the standard library,
torch, triton, numpy, safetensors), and what every new interpreter runs (site-packages'
.pth files, sitecustomize), are fingerprinted once, before any candidate runs, and
checked after every judgement: any write changes a file's ctime, which no process can set
back. Bytecode is written by imports too (a first import, a stale file), and two processes
may write one file's differently: a bytecode file that changed counts only when its code is
not what its source compiles to, and a new one not at all (Python uses it only where the
source's size and mtime, watched, say it may). A runner closed off (fitness.isolation)
writes no file at all; this is the defence where one cannot be, and it watches these trees
only (fitness/README.md, "What is left open").
"""
import importlib.util
import marshal
import os
import site
import sysconfig
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What a judge, a runner and the search import from the repository.
PACKAGES = ("contract", "fitness", "evolve", "mutations", "target", "seed_engine")
INSTALLED = ("torch", "triton", "numpy", "safetensors")
CODE = (".py", ".pyc", ".so")
# Standard-library folders nothing judging imports (and the installed packages, watched apart).
NOT_IMPORTED = {"site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip"}


class CodeChanged(Exception):
    """A file of the code that judges changed: no verdict given since it could have is trusted."""


def roots() -> list:
    """Every watched tree."""
    found = [REPO / name for name in PACKAGES if (REPO / name).is_dir()]
    found.append(Path(sysconfig.get_paths()["stdlib"]))
    for name in INSTALLED:
        spec = importlib.util.find_spec(name)
        found += [Path(folder) for folder in (spec.submodule_search_locations or [])] if spec else []
    return found


def file_mark(path) -> tuple:
    """What identifies a file as written: device, inode, size, mtime and ctime (any write
    changes the ctime, which no process can set back)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def code_files(root: Path):
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in NOT_IMPORTED]
        for name in names:
            if name.endswith(CODE) or ".so." in name:
                yield os.path.join(folder, name)


def startup_files():
    """What every new interpreter runs: the .pth files (their import lines) and the
    sitecustomize and usercustomize modules at the top of each site-packages folder."""
    for folder in site.getsitepackages() + [site.getusersitepackages()]:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        yield from (os.path.join(folder, name) for name in names if name.endswith((".pth", ".py")))


def marks() -> dict:
    """{path: mark} of every watched file (~8,400 files, ~70 ms on a 2-core machine)."""
    found = {}
    paths = [path for root in roots() for path in code_files(root)] + list(startup_files())
    for path in paths:
        try:
            found[path] = file_mark(path)
        except OSError:  # gone between the walk and the look
            pass
    return found


def honest_bytecode(path: str) -> bool:
    """Whether a bytecode file holds what its source compiles to."""
    try:
        source = importlib.util.source_from_cache(path)
        with open(path, "rb") as f:
            data = f.read()
        if data[:4] != importlib.util.MAGIC_NUMBER:
            return False
        optimize = 2 if ".opt-2." in path else 1 if ".opt-1." in path else 0
        with open(source, "rb") as f:
            compiled = compile(f.read(), source, "exec", dont_inherit=True, optimize=optimize)
        return marshal.loads(data[16:]) == compiled
    except (OSError, ValueError, EOFError, TypeError, SyntaxError):
        return False


class OwnCode:
    """The watched files as they were when made (`check` compares)."""

    def __init__(self):
        self.known = marks()
        self.lock = threading.Lock()

    @classmethod
    def of_this_process(cls) -> "OwnCode":
        """The first one this process made (of the trees `roots` names now): taken before any
        candidate of this process ran, it is the one to trust; a judge made later shares it."""
        key = tuple(roots())
        with FIRST_LOCK:
            if key not in FIRST:
                FIRST[key] = cls()
            return FIRST[key]

    def changed(self) -> list:
        """Files changed, gone, or new since (new bytecode aside); call under `lock`."""
        now = marks()
        changed = [path for path, was in self.known.items() if now.get(path) != was]
        honest = [path for path in changed if path.endswith(".pyc") and path in now and honest_bytecode(path)]
        self.known.update((path, now[path]) for path in honest)  # compiled once, not at every check
        new = [path for path in now if path not in self.known and not path.endswith(".pyc")]
        return sorted(set(changed) - set(honest)) + sorted(new)

    def check(self) -> None:
        with self.lock:
            changed = self.changed()
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            raise CodeChanged(f"the code that judges changed on disk while candidates ran: "
                              f"{', '.join(changed[:3])}{more}")


FIRST = {}  # roots -> the process's first OwnCode of them
FIRST_LOCK = threading.Lock()
