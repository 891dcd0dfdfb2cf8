"""Import one candidate engine file, and make sure the module that ran is that file."""
import hashlib
import importlib.util
import sys
from pathlib import Path

# The seed: the first engine, which the search starts from and every program descends from.
SEED_ENGINE = Path(__file__).resolve().parents[1] / "seed_engine" / "engine.py"


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def load_engine_module(path):
    """Import `path` under a name of its own; return the module.

    The module name carries the source's hash, so two candidates in one process never
    share a cached module, and the check below proves the judged file is the one imported.
    """
    path = Path(path).resolve()
    source = path.read_text()
    name = f"candidate_{source_hash(source)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if Path(module.__file__).resolve() != path:
        raise ImportError(f"imported {module.__file__}, expected {path}")
    if not callable(getattr(module, "create_engine", None)):
        raise ImportError(f"{path} defines no create_engine")
    return module
