"""Triton's interpreter (TRITON_INTERPRET=1) with its per-launch cost cut, for the CPU tests.

Every kernel launch, and every call of one jit function from another, patches the builtins
of triton.language anew, and finds them by listing each package with inspect.getmembers
(dir, a sort, a getattr of every member): on the interpreted prefill-graph check, 80,033
listings and 31% of its time. `install` lists each package's builtin names once; each patch
still reads the member and skips one patched already, as triton's own does, so what runs is
unchanged. Where a triton lacks the function it replaces, nothing is replaced.
"""
import inspect

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
