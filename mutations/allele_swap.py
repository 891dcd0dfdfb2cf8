"""Allele swaps: replace one gene's definition with another implementation from the library.

The swap brings the helpers and imports the allele needs, prunes what nothing uses any
more, and settles declared requirements: a gene the new allele needs in another form is
swapped too (to the first allowed allele that runs wherever this operator runs), and a gene
whose own requirement the swap breaks goes back to its seed allele. A program under
programmatic dependent launch keeps every kernel under it. It declines when the
program lacks the gene, already carries the allele, or the requirements cannot settle.
"""
import random

from mutations import alleles, program, requirements
from mutations.base import Applied, Declined, Operator
from mutations.rewrites import programmatic_launch


class AlleleSwapOperator(Operator):
    kind = "allele"

    def __init__(self, allele: alleles.Allele):
        self.allele = allele
        self.name = f"allele.{allele.gene}.{allele.name}"
        self.devices = allele.devices
        self.gpu_lever = allele.gpu_lever
        self.cannot_serve = allele.cannot_serve
        self.description = f"{allele.gene} := {allele.name}: {allele.description}"

    @property
    def needs_swap(self) -> str:
        """A swap back to the seed allele has nothing to do on the seed: first the swap to
        another allele of its gene, a CPU one where there is one."""
        gene = self.allele.gene
        if self.allele.name != program.SEED_ALLELE:
            return ""
        others = sorted((a.devices != "any", name) for (g, name), a in alleles.library().items()
                        if g == gene and name != program.SEED_ALLELE)
        return f"allele.{gene}.{others[0][1]}"

    def plan(self, source: str):
        """(module, closed assignment, repairs) or the reason the swap cannot happen."""
        try:
            module = program.parse(source)
        except program.ProgramError as err:
            return str(err)
        carried = program.gene_alleles(module)
        gene = self.allele.gene
        if gene not in carried:
            return f"the program defines no {gene}"
        if carried[gene] == self.allele.name:
            return f"{gene} already carries {self.allele.name}"
        wanted = dict(carried, **{gene: self.allele.name})
        closed, repairs = requirements.settle(wanted, {gene}, self.pick_allowed, lambda g: program.SEED_ALLELE)
        if closed is None:
            return repairs
        return module, closed, repairs

    def pick_allowed(self, gene: str, allowed) -> str | None:
        """The first allowed allele of `gene` that runs wherever this operator runs."""
        for name in allowed:
            candidate = alleles.get(gene, name)
            if candidate and (self.devices == "cuda" or candidate.devices == "any"):
                return name
        return None

    def unports(self, source: str) -> bool:
        """Whether the swap puts a portable allele where the program runs a GPU-only one, in
        its own gene or in one it repairs: on a GPU that undoes a kernel (seen on an H100:
        decode graphs over prefill graphs 0.41x, SDPA prefills over the Triton one 0.2x; on
        Qwen3-0.6B, q/k/v fused alone where gate/up were too, which sends the SwiGLU kernel
        back to the seed's MLP, 0.83x)."""
        planned = self.plan(source)
        if isinstance(planned, str):
            return False
        module, closed, _ = planned
        carried = program.gene_alleles(module)
        for gene, name in closed.items():
            now, then = alleles.get(gene, carried.get(gene)), alleles.get(gene, name)
            if name != carried.get(gene) and now and then and now.devices == "cuda" and then.devices != "cuda":
                return True
        return False

    def applies(self, source: str) -> str | None:
        planned = self.plan(source)
        return planned if isinstance(planned, str) else None

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        planned = self.plan(source)
        if isinstance(planned, str):
            return Declined(self.name, planned)
        module, closed, repairs = planned
        carried = program.gene_alleles(module)
        sources = []
        for gene, name in closed.items():
            if name != carried[gene]:
                allele = alleles.get(gene, name)
                module = allele.placed(module)
                sources.append(allele.module)
        source = program.finish(module, sources + [alleles.shared_module(), program.seed_module()])
        source = programmatic_launch.kept(source)
        args = {"gene": self.allele.gene, "allele": self.allele.name, "repairs": repairs}
        return Applied(source, self.name, args)


def swap_operators() -> list:
    """One operator per allele in the library, in gene order then by name (seed first)."""
    library = alleles.library()
    ordered = sorted(library, key=lambda key: (program.GENES.index(key[0]), key[1] != program.SEED_ALLELE, key[1]))
    genes_with_choices = {gene for gene, name in library if name != program.SEED_ALLELE}
    return [AlleleSwapOperator(library[key]) for key in ordered if key[0] in genes_with_choices]
