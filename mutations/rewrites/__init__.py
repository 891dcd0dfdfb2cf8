"""Structural rewrites: one libcst transformer per file, each working on any program in gene form."""
