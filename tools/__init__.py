"""Measuring tools on top of the packages, run by hand or on the GPU machine.

    python -m tools.walk        a random walk from the seed: how many children pass the gate
    python -m tools.gpu_check   every operator's child of the seed judged on a GPU
    python -m tools.swap_orders pairs of swaps in both orders: one engine, one source?
    bash tools/gpu_issue7.sh    one device call each: the search and its judge (docs/PERF.md)
    bash tools/gpu_issue8.sh    one device call each: the operators against the targets

They judge what `mutations` makes with `fitness`, which is why they live here: the
operators themselves never import the judge.
"""
