"""Helpers a rewrite copies into programs, one file each. Importable (tools time the kernels,
the CPU tests run them in Triton's interpreter), but not a rewrite: `mutations` never imports
them, as they import triton."""
