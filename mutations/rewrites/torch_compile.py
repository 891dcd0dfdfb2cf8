"""Wrap one tensor-function gene in torch.compile, with a mode and a dynamic-shape choice.

The gene gets the decorator `@compiled_unless_bf16(mode=..., dynamic=...)` (a helper the
rewrite brings): torch.compile on fp16 and fp32 calls, the gene as written on bf16 ones,
whose fused rounding misses the reference (an H100 search: an MLP compiled with
max-autotune failed the bf16 derived config at 1.07x the tolerance). Its allele stays
what it was. Modes are "default" and "max-autotune-no-cudagraphs": "reduce-overhead"
records CUDA graphs of its own, which nest badly inside the CUDA-graph engine's capture and
re-record on every new shape. Declines when every such gene is compiled already or runs a
Triton kernel of its own. Runs on CUDA only: on CPU, inductor's compile time per candidate
(about 20 s) dwarfs anything it could win, so the CPU search leaves it out.
"""
import itertools
import json
import random

import libcst as cst

from mutations import alleles, program
from mutations.base import Applied, Declined, agrees
from mutations.rewrites import StructuralRewrite

DESCRIPTION = "wrap a tensor-function gene in torch.compile (mode, dynamic)"
COMPILABLE_GENES = ("rms_norm", "add_rms_norm", "rope_tables", "apply_rope", "qkv_proj", "mlp")
MODES = ("default", "max-autotune-no-cudagraphs")
DYNAMIC = (None, True, False)
HELPER = program.parse('''import torch


def compiled_unless_bf16(mode, dynamic):
    """A decorator: the function through torch.compile, except on calls with a bf16 tensor
    or dtype among their arguments, which run it as written (inductor's fused bf16
    rounding misses the reference)."""
    def wrap(fn):
        compiled = torch.compile(fn, mode=mode, dynamic=dynamic)

        def call(*args, **kwargs):
            values = [*args, *kwargs.values()]
            bf16 = any(v is torch.bfloat16 or getattr(v, "dtype", None) is torch.bfloat16 for v in values)
            return (fn if bf16 else compiled)(*args, **kwargs)
        return call
    return wrap
''')


def is_compiled(func: cst.FunctionDef) -> bool:
    return any(program.code(d.decorator).startswith(("torch.compile", "compiled_unless_bf16"))
               for d in func.decorators)


def compilable(module: cst.Module) -> list:
    """Genes that can take the decorator, in gene order."""
    defs = program.definitions(module)
    found = []
    for gene in COMPILABLE_GENES:
        func = defs.get(gene)
        if not isinstance(func, cst.FunctionDef) or is_compiled(func):
            continue
        allele = alleles.get(gene, program.allele_of(func))
        if allele is None or allele.devices == "any":  # a Triton launcher gains nothing
            found.append(gene)
    return found


class TorchCompileOperator(StructuralRewrite):
    name = "torch_compile"
    order = 2
    draws = True  # gene, mode and dynamic
    # Its children compile on every fresh engine: a screen of one is 2-3x another's (H100:
    # 52 s against 20-25 s alone; its batch of 5 screens 113 s against 45 s), and in six GPU
    # searches it paid once (1.10x on the seed), 0.85-0.93x on faster programs
    # (docs/log/2026-11-24-merging-a-generations-gains.md).
    slow_to_judge = True
    devices = "cuda"
    description = DESCRIPTION
    declined_because = "every tensor-function gene is compiled or runs its own kernel"
    find = staticmethod(compilable)

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        module = program.parse(source)
        found = compilable(module)
        return self.compile(module, found[rng.randrange(len(found))], rng.choice(MODES), rng.choice(DYNAMIC))

    def rewrite_as(self, source: str, args: dict) -> Applied | Declined:
        module = program.parse(source)
        for gene, mode, dynamic in itertools.product(compilable(module), MODES, DYNAMIC):
            if agrees({"gene": gene, "mode": mode, "dynamic": dynamic}, args):
                return self.compile(module, gene, mode, dynamic)
        return Declined(self.name, f"no compilable gene, mode and dynamic match {json.dumps(args, sort_keys=True)}")

    def compile(self, module: cst.Module, gene: str, mode: str, dynamic) -> Applied:
        decorator = cst.Decorator(decorator=cst.parse_expression(
            f"compiled_unless_bf16(mode={mode!r}, dynamic={dynamic})"))
        func = program.definitions(module)[gene]
        module = program.replace_gene(module, gene, func.with_changes(decorators=[*func.decorators, decorator]))
        child = program.finish(module, [HELPER, program.seed_module()])
        return Applied(child, self.name, {"gene": gene, "mode": mode, "dynamic": dynamic})
