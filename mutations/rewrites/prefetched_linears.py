"""Small matmuls by a weight through a Triton kernel that loads the weight before it waits.

A decode step's projections are a few rows times a weight: on an H100 each costs ~4 us
whoever writes it, of which the weight's bytes are a fraction (the public o projection,
1.2 MB, is 0.4 us at 3 TB/s). The rest is the launch, the ramp-up and the memory latency,
paid after the kernel before has finished. Here a program loads its share of the weight
first (no kernel before it writes a weight), then waits for the kernel before
(`gdc_wait`) and reads x: launched under programmatic dependent launch (PDL), that wait
overlaps the kernel before. Measured alone
(docs/log/2026-11-24-search-480ebbd-decode-kernel-costs.md, 8 rows): the public o 3.92 ->
2.36 us, q/k/v 4.54 -> 3.75, down 7.38 -> 5.54; gate/up (6144 x 768) and every 1B-class
projection were slower (a program holds its share in registers), hence the size limit. One
row (a batch-1 decode) is summed in fp32 registers, no tensor-core tile, and in bf16 beat
cuBLAS alone on every Llama-3.2-1B and Qwen3-0.6B projection but two (within 4%), lm_head
included (docs/log/2026-11-26-one-row-projections-in-triton.md): one row has a limit of its
own.

Every `E @ S.T` whose weight S is a subscript (`layer["o"]`, `self.w["lm_head"]`) becomes
`prefetched_linear(E, S)`, which takes cuBLAS's path unless the rows are few, the weight is
small and the dtype fp16 or bf16 (fp32 keeps the reference's own matmul; in bf16 the kernel's
fp32 sum, rounded once, may differ from cuBLAS's in the order of its terms, and the gate's
bf16 configs decide whether that stays within the tolerance). The overlap only
comes when the kernel before lets it start early, so the rewrite also puts every other
Triton kernel under PDL (programmatic_launch). cuda only, and only for a program whose
Engine runs its calls in CUDA graphs: a Triton launch from Python costs ~12 us of host time
on an H100, a cuBLAS one ~9. Declines when no matmul by a subscripted weight is left.
"""
import random
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from mutations import alleles, program
from mutations.base import Applied, Declined
from mutations.rewrites import StructuralRewrite
from mutations.rewrites.programmatic_launch import kernels_without_flag, under_pdl

DESCRIPTION = "small matmuls through a Triton kernel that loads its weight before waiting (under PDL)"
HELPER = "prefetched_linear"
WEIGHT_MATMUL = m.BinaryOperation(operator=m.MatrixMultiply(), right=m.Attribute(value=m.Subscript(), attr=m.Name("T")))
GRAPH_ENGINES = ("cuda_graphs", "cuda_graphs_prefill")

# The helpers and their imports come from this file, as an allele's do from its own: it is
# importable, so tools can time the kernels and the CPU tests interpret them.
KERNELS = Path(__file__).parent / "kernels" / "prefetched_linear.py"


def matmul_sites(module: cst.Module) -> list:
    """The code of every `E @ S.T` by a subscripted weight, in source order, in a program
    whose calls run in CUDA graphs (else none)."""
    if program.gene_alleles(module).get("Engine") not in GRAPH_ENGINES:
        return []
    return [program.code(node) for node in m.findall(module, WEIGHT_MATMUL)]


class ThroughHelper(cst.CSTTransformer):
    def leave_BinaryOperation(self, original_node, updated_node):
        if not m.matches(original_node, WEIGHT_MATMUL):
            return updated_node
        return cst.Call(func=cst.Name(HELPER), args=[cst.Arg(updated_node.left.with_changes(lpar=[], rpar=[])),
                                                     cst.Arg(updated_node.right.value)])


class PrefetchedLinearsOperator(StructuralRewrite):
    name = "prefetched_linears"
    order = 7
    needs_swap = "allele.Engine.cuda_graphs"  # it rewrites only programs run in CUDA graphs
    program_wide = True  # every kernel and launch: merged by applying it again
    devices = "cuda"
    description = DESCRIPTION
    declined_because = "no matmul by a subscripted weight in a program run in CUDA graphs"
    find = staticmethod(matmul_sites)

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        module = program.parse(source)
        sites = matmul_sites(module)
        module = module.visit(ThroughHelper())
        module = under_pdl(module, kernels_without_flag(module))  # the helpers' kernels are under it already
        child = program.finish(module, [alleles.allele_module(KERNELS), program.seed_module()])
        return Applied(child, self.name, {"sites": sites})
