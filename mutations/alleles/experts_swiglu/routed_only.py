"""Each expert's SwiGLU over its contiguous slice of the sorted rows, for the experts that have rows only.

The seed splits the rows by every expert's count and runs all E experts, three matmuls
each, however few rows reach one: at a decode step most experts get none (Qwen3-30B-A3B:
one token reaches 8 of 128), so most of its 3 x E launches multiply empty tensors. Here
the counts come to the host once, each busy expert's slice starts at the sum of the
counts before it, and its output is written in place into one [N*k, hidden] tensor (no
list of outputs to concatenate).
"""
import torch
import torch.nn.functional as F

REQUIRES = {}
DEVICES = "any"


def experts_swiglu(rows, counts, layer):
    """Each expert's SwiGLU over the rows sent to it: rows [N*k, hidden] grouped by expert
    (counts [E] of them each) -> [N*k, hidden] in the same order."""
    out = torch.empty_like(rows)
    start = 0
    for e, count in enumerate(counts.tolist()):  # one host read of every count
        if count:
            rows_e = rows[start:start + count]  # [count, hidden], a view
            hidden = F.silu(rows_e @ layer["experts_gate"][e].T) * (rows_e @ layer["experts_up"][e].T)
            out[start:start + count] = hidden @ layer["experts_down"][e].T
            start += count
    return out
