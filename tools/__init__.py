"""Measuring tools on top of the packages, run by hand or on the GPU machine.

    python -m tools.walk        a random walk from the seed: how many children pass the gate
    python -m tools.gpu_check   every operator's child of the seed judged on a GPU
    bash tools/gpu_*.sh         one device call each: the checks behind docs/PERF.md

They judge what `mutations` makes with `fitness`, which is why they live here: the
operators themselves never import the judge.
"""
