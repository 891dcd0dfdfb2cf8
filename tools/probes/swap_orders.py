"""Does one engine have one source? Every pair of single allele swaps of the seed, applied
in both orders: how many pairs reach the same alleles yet write two different sources.

    python -m tools.probes.swap_orders      (about 1.5 minutes on one core)
"""
import itertools

import mutations
from mutations import alleles, program


def swapped(name: str, source: str) -> str | None:
    result = mutations.get_operator(name).replay(source, {})
    return result.source if isinstance(result, mutations.Applied) else None


def survey() -> tuple[int, list]:
    """(pairs reaching the same alleles both ways, those of them written two ways)."""
    seed = program.SEED_PATH.read_text()
    singles = {}
    for gene, name in alleles.library():
        if name != program.SEED_ALLELE and (source := swapped(f"allele.{gene}.{name}", seed)):
            singles[f"allele.{gene}.{name}"] = source
    same_alleles, differ = 0, []
    for a, b in itertools.combinations(sorted(singles), 2):
        ab, ba = swapped(b, singles[a]), swapped(a, singles[b])
        if ab and ba and program.gene_alleles(program.parse(ab)) == program.gene_alleles(program.parse(ba)):
            same_alleles += 1
            if ab != ba:
                differ.append((a, b))
    return same_alleles, differ


if __name__ == "__main__":
    pairs, differ = survey()
    print(f"{len(differ)} of {pairs} pairs write one engine as two sources")
    for a, b in differ:
        print(f"  {a} + {b}")
