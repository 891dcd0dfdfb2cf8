"""Programmatic dependent launch (PDL) for every Triton kernel of a program.

Inside a CUDA graph one kernel after another still pays its launch and ramp-up: an H100's
decode step of the public model is ~90 kernels of 1-6 us. Under PDL a kernel launched with
`launch_pdl=True` may start while the one before it is finishing; it waits for that one's
results at `gdc_wait()` (all of its grid done and its writes visible), and lets the next
one start early once it has called `gdc_launch_dependents()`. Both calls come first in
the kernel here, the release first: the next kernel is launched while this one still waits
for its own inputs, so a chain of small kernels does not pay each launch in turn, and the
next matmul can load its weight (written by no kernel) meanwhile. Every kernel still reads
only finished results (each waits at `gdc_wait()`, and a kernel before it ended only after
its own wait): what is saved is the launch and ramp-up, not any ordering. A kernel may thus
start while several kernels before it still run: whatever one reads before its own wait
(the prefetched linear's weight) must be written by no kernel of the step.

Each kernel gets a `PDL: tl.constexpr = False` parameter that guards both calls, and each
launch of one (`kernel[grid](...)`) passes `PDL=PDL_LAUNCH, launch_pdl=PDL_LAUNCH`, where
PDL_LAUNCH is true on a Hopper or later GPU outside Triton's interpreter. The flag travels
with the launch, so a launch under PDL of a kernel without the wait cannot happen: a kernel
without the parameter rejects the argument. A program under PDL stays so: a swap or merge
that brings it a kernel without the parameter puts that one under PDL too (`kept`; an H100
search's swap of the RoPE kernel under a shared launcher that passed the flag crashed).
A kernel that places its own wait (the split-KV decode's, which first loads what no kernel
of the step writes) has the parameter already: only its launches get the flag. Declines
when every kernel and launch is under PDL already, or there is none.
"""
import random

import libcst as cst
import libcst.matchers as m

from mutations import program
from mutations.base import Applied, Declined
from mutations.rewrites import StructuralRewrite

DESCRIPTION = "launch every Triton kernel under programmatic dependent launch (Hopper and later)"
FLAG = "PDL"
SWITCH = "PDL_LAUNCH"
JIT = m.Decorator(decorator=m.Attribute(value=m.Name("triton"), attr=m.Name("jit"))
                  | m.Call(func=m.Attribute(value=m.Name("triton"), attr=m.Name("jit"))))
IMPORTS = ["import os\n", "import torch\n", "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait\n"]
SWITCH_STATEMENT = f"""\
# Programmatic dependent launch needs a Hopper or later GPU, and Triton's interpreter has none.
{SWITCH} = (os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()
              and torch.cuda.get_device_capability()[0] >= 9)
"""
GUARD = f"""\
if {FLAG}:  # let the next kernel start (it waits for this one's writes); wait for the one before
    gdc_launch_dependents()
    gdc_wait()
"""


def is_kernel(stmt) -> bool:
    return isinstance(stmt, cst.FunctionDef) and any(m.matches(d, JIT) for d in stmt.decorators)


def has_flag(kernel: cst.FunctionDef) -> bool:
    return any(p.name.value == FLAG for p in kernel.params.params)


def kernels_without_flag(module: cst.Module) -> list:
    """Names of the program's Triton kernels not yet under PDL, in source order: those
    without the flag, and those that place their own wait (they have it) but are launched
    without it. A jit function another one calls (`split_share(...)`) is a device
    function, not launched."""
    calls = [c for c in program.walk(module) if isinstance(c, cst.Call)]
    called = {c.func.value for c in calls if isinstance(c.func, cst.Name)}
    bare = {c.func.value.value for c in calls if launched(c, set())}  # launches without it
    return [s.name.value for s in module.body if is_kernel(s) and s.name.value not in called
            and (not has_flag(s) or s.name.value in bare)]


def launched(call: cst.Call, names: set) -> bool:
    """`NAME[grid](...)` of one of `names`, or of a parameter named like one (`kernel`)."""
    return m.matches(call.func, m.Subscript(value=m.Name())) \
        and (call.func.value.value in names or call.func.value.value.endswith("kernel")) \
        and not any(a.keyword is not None and a.keyword.value == FLAG for a in call.args)


class UnderPDL(cst.CSTTransformer):
    """The flag and the guarded calls into each kernel, the flag into each launch."""

    def __init__(self, names):
        self.names = set(names)

    def leave_FunctionDef(self, original_node, updated_node):
        if updated_node.name.value not in self.names or not is_kernel(updated_node) or has_flag(updated_node):
            return updated_node
        flag = cst.Param(name=cst.Name(FLAG), annotation=cst.Annotation(cst.parse_expression("tl.constexpr")),
                         default=cst.Name("False"))
        params = updated_node.params.with_changes(params=[*updated_node.params.params, flag])
        lines = list(updated_node.body.body)
        at = 1 if lines and program.is_docstring(lines[0]) else 0
        lines.insert(at, cst.parse_statement(GUARD))
        return updated_node.with_changes(params=params, body=updated_node.body.with_changes(body=lines))

    def leave_Call(self, original_node, updated_node):
        if not launched(original_node, self.names):
            return updated_node
        args = list(updated_node.args)
        if args:  # the call may end in a trailing comma: one comma before the new arguments
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args += [cst.Arg(keyword=cst.Name(key), value=cst.Name(SWITCH), equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if key == FLAG else cst.MaybeSentinel.DEFAULT)
            for key in (FLAG, "launch_pdl")]
        return updated_node.with_changes(args=args)


def under_pdl(module: cst.Module, names: list) -> cst.Module:
    """`module` with the kernels `names` and their launches under PDL, and the switch."""
    module = module.visit(UnderPDL(names))
    module = program.add_imports(module, [cst.parse_statement(line) for line in IMPORTS])
    if SWITCH not in program.definitions(module):
        body = list(module.body)
        first = next(i for i, s in enumerate(body) if not program.is_import(s) and not program.is_docstring(s))
        switch = cst.parse_statement(SWITCH_STATEMENT)
        body.insert(first, switch.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *switch.leading_lines]))
        module = module.with_changes(body=body)
    return module


def kept(source: str) -> str:
    """`source` with every kernel under PDL when the program already launches some so (it
    defines the switch), else as it is: what a swap or merge finishes with."""
    module = program.parse(source)
    if SWITCH not in program.definitions(module) or not (names := kernels_without_flag(module)):
        return source
    return program.finish(under_pdl(module, names), [program.seed_module()])


class ProgrammaticLaunchOperator(StructuralRewrite):
    name = "programmatic_launch"
    order = 6
    needs_swap = "allele.rms_norm.triton"  # the seed has no Triton kernel
    program_wide = True  # every kernel and launch: merged by applying it again
    devices = "cuda"
    description = DESCRIPTION
    declined_because = "no Triton kernel without programmatic dependent launch"
    find = staticmethod(kernels_without_flag)

    def rewrite(self, source: str, rng: random.Random) -> Applied | Declined:
        module = program.parse(source)
        names = kernels_without_flag(module)
        child = program.finish(under_pdl(module, names), [program.seed_module()])
        return Applied(child, self.name, {"kernels": names})
