"""An allele's file as a module, for the probes and the interpreted kernel checks that run
its kernels alone."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ALLELES = REPO / "mutations" / "alleles"


def load_allele(gene: str, name: str):
    """mutations/alleles/GENE/NAME.py over the seed's and the shared helpers a swap would
    bring with it."""
    module = None
    for path in (REPO / "seed_engine" / "engine.py", ALLELES / "shared.py", ALLELES / gene / f"{name}.py"):
        spec = importlib.util.spec_from_file_location(f"allele_{gene}_{name}_{path.stem}", path)
        loaded = importlib.util.module_from_spec(spec)
        if module is not None:
            vars(loaded).update({k: v for k, v in vars(module).items() if not k.startswith("__")})
        spec.loader.exec_module(loaded)
        module = loaded
    return module
