"""tools.probes.step_timeline: what each kernel of a decode step adds to the step's end."""
from tools.probes import step_timeline


def test_calls_are_cut_where_the_gpu_idles_and_a_kernel_adds_only_past_the_latest_end():
    # Two calls 100 us apart; in each, b starts early (programmatic launch) and ends 3 us
    # after a, and c runs inside b's time, adding nothing.
    call = [("a(int)", 0.0, 10.0), ("b", 2.0, 13.0), ("c", 4.0, 12.0)]
    kernels = call + [(name, start + 100.0, end + 100.0) for name, start, end in call]
    steps = step_timeline.clusters(kernels[::-1], gap_us=20.0)
    assert [[k[0] for k in step] for step in steps] == [["a(int)", "b", "c"]] * 2
    table = step_timeline.step_table(steps)
    assert table["steps"] == 2 and table["span_us"] == 13.0
    rows = table["kernels"]
    assert rows["a"] == {"per_step": 1.0, "duration_us": 10.0, "add_us": 10.0, "step_add_us": 10.0}
    assert rows["b < a"]["duration_us"] == 11.0 and rows["b < a"]["add_us"] == 3.0
    assert rows["c < b < a"]["add_us"] == 0.0
    assert sum(row["step_add_us"] for row in rows.values()) == table["span_us"]
