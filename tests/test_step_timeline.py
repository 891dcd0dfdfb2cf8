"""tools.probes.step_timeline: what each kernel of a decode step adds to the step's end."""
from types import SimpleNamespace

import pytest

from tools.probes import step_timeline


def test_steps_are_the_kernels_between_markers_and_a_kernel_adds_only_past_the_latest_end():
    # Two calls, each after a marker; in each, b starts early (programmatic launch) and ends
    # 3 us after a, and c runs inside b's time, adding nothing. A copy is no step's kernel.
    call = [("a(int)", 0.0, 10.0), ("b", 2.0, 13.0), ("c", 4.0, 12.0)]
    kernels = [("prefill", -50.0, -40.0), ("spin_kernel(long)", -5.0, -1.0), *call, ("spin_kernel(long)", 20.0, 22.0),
               ("Memcpy HtoD", 95.0, 96.0), *[(name, start + 100.0, end + 100.0) for name, start, end in call],
               ("spin_kernel(long)", 120.0, 122.0)]
    steps = step_timeline.between_markers(kernels)
    assert [[k[0] for k in step] for step in steps] == [["a(int)", "b", "c"]] * 2
    table = step_timeline.step_table(steps)
    assert table["steps"] == 2 and table["span_us"] == 13.0
    rows = table["kernels"]
    assert rows["a"] == {"per_step": 1.0, "duration_us": 10.0, "add_us": 10.0, "step_add_us": 10.0}
    assert rows["b < a"]["duration_us"] == 11.0 and rows["b < a"]["add_us"] == 3.0
    assert rows["c < b < a"]["add_us"] == 0.0
    assert sum(row["step_add_us"] for row in rows.values()) == table["span_us"]


def test_the_steps_are_the_cases_first_run_of_decode_calls():
    calls = [SimpleNamespace(event=SimpleNamespace(kind=kind))
             for kind in ("prefill", "decode", "decode", "remove", "decode")]
    assert step_timeline.decode_run(calls) == (1, 3)
    with pytest.raises(SystemExit, match="no decode call"):
        step_timeline.decode_run(calls[:1])
