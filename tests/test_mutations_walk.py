"""Random walks of 80 rewrites and 20 crossovers in all from the seed, every distinct child judged
once on CPU: at least 90% pass the static stage and 70% the gate (figures printed under `pytest -s`, without -n)."""
import json
import sys

from tests.side_by_side import side_by_side
from tools.gate_survival import format_report


def test_random_walk_children_pass_static_and_gate():
    # Two walks of half the length, one process each: a walk is one child after another, and
    # the machine has a core for each (~0.5 s a child).
    walks = side_by_side([[sys.executable, "-m", "tools.gate_survival", "--steps", "40", "--crosses", "10",
                           "--seed", str(seed), "--json"] for seed in (0, 1)], timeout=300)
    reports = []
    for done in walks:
        assert done.returncode == 0, done.stderr
        reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for report in reports:
        print("\n" + format_report(report, report["seconds"], derived=False))
        assert report["by_kind"]["mutate"][0] == 40 and report["by_kind"]["cross"][0] == 10
    children = sum(r["children"] for r in reports)
    assert sum(r["static_pass"] * r["children"] for r in reports) / children >= 0.9
    assert sum(r["gate_pass"] * r["children"] for r in reports) / children >= 0.7
