"""One line per `python -m fitness bench` result on stdin: tokens/s of each case, its
fraction of the roofline when there is one, a decode step's ms where `--step-time` gave
it, the spread of the fresh engines' runs behind the median, and peak memory, the contract's
(two engines alive) and one engine's (for GPU logs).

    python -m fitness bench ... | python -m tools.bench_line LABEL
"""
import json
import sys


def line(label: str, results: list) -> str:
    parts = []
    for r in results:
        roof = f"({r['fraction_of_roofline']:.3f} of {r['roofline_tokens_per_second']:.0f})" \
            if "fraction_of_roofline" in r else ""
        step = f" step={r['ms_per_decode_step']:.3f}ms" if "ms_per_decode_step" in r else ""
        if "fraction_of_step_roofline" in r:
            step += f"({r['fraction_of_step_roofline']:.3f} of {r['roofline_ms_per_decode_step']:.3f})"
        one = f" (one engine {r['engine_peak_mb']:.0f}MB)" if r.get("engine_peak_mb") else ""
        runs = f" runs {min(r['run_ms']):.1f}-{max(r['run_ms']):.1f}ms" if r.get("run_ms") else ""
        parts.append(f"{r['case_name']}={r['tokens_per_second']:.0f}{roof}{step}{runs} {r['peak_memory_mb']:.0f}MB{one}")
    return f"{label} " + " ".join(parts)


if __name__ == "__main__":
    print(line(" ".join(sys.argv[1:]), json.load(sys.stdin)))
