"""An allele's file as a module, for the probes that time or check its kernels alone."""
import importlib.util
from pathlib import Path

ALLELES = Path(__file__).resolve().parents[2] / "mutations" / "alleles"


def load_allele(gene: str, name: str):
    """mutations/alleles/GENE/NAME.py over the shared helpers a swap brings with it."""
    module = None
    for path in (ALLELES / "shared.py", ALLELES / gene / f"{name}.py"):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        loaded = importlib.util.module_from_spec(spec)
        if module is not None:
            vars(loaded).update({k: v for k, v in vars(module).items() if not k.startswith("__")})
        spec.loader.exec_module(loaded)
        module = loaded
    return module
