"""Import one candidate engine file from the text its caller read."""
import hashlib
import importlib.machinery
import importlib.util
import linecache
import sys
from pathlib import Path

# The seed: the first engine, which the search starts from and every program descends from.
SEED_ENGINE = Path(__file__).resolve().parents[1] / "seed_engine" / "engine.py"


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def load_engine_module(path, source: str | None = None):
    """Import `path` under a name of its own; return the module.

    The module is compiled from `source`, the file's text as the caller read it (here, when
    not given), never from the file read again nor from a cached .pyc beside it: another
    program run meanwhile may have rewritten either (the judge reads every file of a
    judgement before any of its programs runs). Its name carries the source's hash, so two
    candidates in one process never share a cached module. The text is what
    `inspect.getsource` finds too (Triton's @jit reads each kernel's source so).
    """
    path = Path(path).resolve()
    source = path.read_text() if source is None else source
    name = f"candidate_{source_hash(source)}_{path.stem}"
    module = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(name, None, origin=str(path)))
    module.__file__ = str(path)
    linecache.cache[str(path)] = (len(source), None, source.splitlines(True), str(path))  # no mtime: kept
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    if not callable(getattr(module, "create_engine", None)):
        raise ImportError(f"{path} defines no create_engine")
    return module
