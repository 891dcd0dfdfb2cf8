"""A random walk of 80 rewrites and 20 crossovers from the seed, every distinct child judged once
on CPU: at least 90% pass the static stage and 70% the gate (figures printed; run with -s)."""
import torch

from tools.walk import SMALL_CONFIG, Judge, format_report, walk


def test_random_walk_children_pass_static_and_gate(small_target, scratch, tmp_path):
    config_path, weight_dir = small_target
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models; immune to oversubscription on a shared machine
    try:
        judge = Judge(SMALL_CONFIG, weight_dir, tmp_path, "cpu", derived=False)
        report = walk(judge, steps=80, crosses=20, seed=0, device="cpu")  # ~0.5 s a child on 2 cores
    finally:
        torch.set_num_threads(threads)
    print("\n" + format_report(report, 0.0, derived=False))
    assert report["by_kind"]["mutate"][0] == 80 and report["by_kind"]["cross"][0] == 20
    assert report["static_pass"] >= 0.9
    assert report["gate_pass"] >= 0.7
