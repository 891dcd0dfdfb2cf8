"""The allele library: alternative implementations of each gene, one readable file each.

`alleles/<gene>/<name>.py` holds a drop-in definition of `<gene>` (same name, signature
and return shape as the seed's), the helpers and imports it needs, and two declarations
that are not copied into programs:

    REQUIRES = {"KVCache": ("slab", "paged")}  # gene -> alleles this one works with
    DEVICES = "cuda"  # "any" | "cuda": where it can run ("cuda" ones may import triton)

and, optionally, `GPU_LEVER = True`: it runs anywhere but pays off on a GPU alone (a sweep
tries it among the first there, last on a CPU); `CANNOT_SERVE = ("delta_net_prefill",)`: seed
genes of a family whose models it cannot run, so a search of such a model never swaps it in
(its child would only crash).

The seed engine's definition of every gene is the "seed" allele; it requires nothing.
Module constants an allele tunes are declared with their range as a trailing comment,
`SLAB_SLOTS = 16  # range: 4..256`, which `tune_constant` reads.
"""
import ast
import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import libcst as cst

from mutations import program

HERE = Path(__file__).resolve().parent
METADATA = ("REQUIRES", "DEVICES", "GPU_LEVER", "CANNOT_SERVE")


@dataclass(frozen=True)
class Allele:
    gene: str
    name: str
    description: str
    devices: str = "any"
    requires: dict = field(default_factory=dict)  # gene -> tuple of allele names
    path: Path | None = None
    gpu_lever: bool = False
    cannot_serve: tuple = ()  # seed genes of the families whose models it cannot run

    @property
    def module(self) -> cst.Module:
        """The file as a libcst module (the seed engine for seed alleles)."""
        return allele_module(self.path) if self.path else program.seed_module()

    def definition(self):
        """The gene's definition, marked with this allele's name."""
        stmt = program.definitions(self.module)[self.gene]
        return program.with_leading(stmt, self.name, program.blank_lines_for(stmt))

    def imports(self) -> list:
        return [s for s in self.module.body if program.is_import(s)]

    def placed(self, module: cst.Module) -> cst.Module:
        """`module` with this allele as its gene, and its imports (its helpers come when the
        program is finished with `self.module` among the sources)."""
        return program.add_imports(program.replace_gene(module, self.gene, self.definition()), self.imports())


@lru_cache(maxsize=None)
def allele_module(path: Path) -> cst.Module:
    """An allele file without its docstring and metadata: what a program may take from it."""
    module = program.parse(path.read_text())
    body = [s for s in module.body
            if not program.is_docstring(s) and program.defined_name(s) not in METADATA]
    return module.with_changes(body=body)


def read_metadata(path: Path) -> tuple:
    """(docstring's first line, DEVICES, REQUIRES, GPU_LEVER, CANNOT_SERVE) of an allele file,
    read as literals."""
    tree = ast.parse(path.read_text())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", "") in METADATA:
            values[node.targets[0].id] = ast.literal_eval(node.value)
    doc = (ast.get_docstring(tree) or "").strip().splitlines()
    requires = {gene: tuple(names) for gene, names in values.get("REQUIRES", {}).items()}
    devices = values.get("DEVICES", "any")
    assert devices in ("any", "cuda"), f"{path}: DEVICES must be 'any' or 'cuda', got {devices!r}"
    return ((doc[0] if doc else ""), devices, requires, bool(values.get("GPU_LEVER", False)),
            tuple(values.get("CANNOT_SERVE", ())))


@lru_cache(maxsize=None)
def library() -> dict:
    """(gene, allele name) -> Allele: every file under alleles/, plus each gene's seed allele."""
    found = {}
    for gene in program.GENES:
        found[(gene, program.SEED_ALLELE)] = Allele(gene, program.SEED_ALLELE, f"the seed's {gene}")
    for path in sorted(HERE.glob("*/*.py")):
        gene, name = path.parent.name, path.stem
        assert gene in program.GENES, f"{path}: {gene} is not a gene"
        description, devices, requires, gpu_lever, cannot_serve = read_metadata(path)
        found[(gene, name)] = Allele(gene, name, description, devices, requires, path, gpu_lever, cannot_serve)
    return found


@lru_cache(maxsize=None)
def shared_module() -> cst.Module:
    """alleles/shared.py: helpers several alleles name, pulled in by the swaps that need them."""
    return allele_module(HERE / "shared.py")


def get(gene: str, name: str) -> Allele | None:
    return library().get((gene, name))


def requirements(gene: str, name: str) -> dict:
    """What (gene, allele) requires of other genes; an allele the library does not know
    (written by hand, say) is taken to require nothing."""
    allele = get(gene, name)
    return allele.requires if allele else {}


def load_module(gene: str, name: str):
    """alleles/GENE/NAME.py as a module over the seed's and the shared helpers a swap would
    bring with it: an allele's kernels run alone, by the tests and the probes."""
    module = None
    for path in (program.SEED_PATH, HERE / "shared.py", HERE / gene / f"{name}.py"):
        spec = importlib.util.spec_from_file_location(f"allele_{gene}_{name}_{path.stem}", path)
        loaded = importlib.util.module_from_spec(spec)
        if module is not None:
            vars(loaded).update({k: v for k, v in vars(module).items() if not k.startswith("__")})
        spec.loader.exec_module(loaded)
        module = loaded
    return module
