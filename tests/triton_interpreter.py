"""Triton's interpreter (TRITON_INTERPRET=1) with its per-launch cost cut, for the CPU tests.

Every kernel launch, and every call of one jit function from another, patches the builtins
of triton.language anew, and finds them by listing each package with inspect.getmembers
(dir, a sort, a getattr of every member): on the interpreted prefill-graph check, 80,033
listings and 31% of its time. `install` lists each package's builtin names once; each patch
still reads the member and skips one patched already, as triton's own does, so what runs is
unchanged. Where a triton lacks the function it replaces, nothing is replaced.

One thing that runs is changed: the interpreter casts fp32 to bf16 by dropping the low 16 bits
(toward zero), where a GPU and torch round to nearest even; through a kernel's roundings that
put the MoE pair kernels 2.7% of their output's scale from the seed's experts.
`install` makes that cast round as torch's does.
"""
import inspect

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

BUILTIN_NAMES = {}  # package (module or class) -> its builtins' names, listed unpatched


def builtin_names(pkg) -> list:
    if pkg not in BUILTIN_NAMES:
        BUILTIN_NAMES[pkg] = [name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
    return BUILTIN_NAMES[pkg]


def patch_builtin(pkg, builder, scope) -> None:
    for name in builtin_names(pkg):
        member = getattr(pkg, name)
        if tl.core.is_builtin(member):
            interpreter._patch_attr(pkg, name, member, builder, scope)


def install() -> None:
    if not (hasattr(interpreter, "_patch_builtin") and hasattr(interpreter, "_patch_attr")):
        return
    for pkg in (tl, tl.core, tl.tensor, tl.math, getattr(tl.core, "tensor_descriptor_base", None)):
        if pkg is not None:
            builtin_names(pkg)  # before any launch has patched them
    interpreter._patch_builtin = patch_builtin
    if hasattr(interpreter.InterpreterBuilder, "cast_impl"):
        interpreter.InterpreterBuilder.cast_impl = rounded_cast(interpreter.InterpreterBuilder.cast_impl)


def rounded_cast(cast_impl):
    """cast_impl, with fp32 to bf16 (bf16 held as uint16 there) rounded to nearest even."""
    if getattr(cast_impl, "rounds_bf16", False):
        return cast_impl

    def cast(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast_impl(self, src, dst_type)
        rounded = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
        return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
    cast.rounds_bf16 = True
    return cast
