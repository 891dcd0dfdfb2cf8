"""The server against the same engine offline, in the three figures its targets are
stated in, from the files tools/gpu/serve.sh writes: OUT/offline.json (tools.serve_offline) and
OUT/bench.json (serve.bench).

    python -m tools.served_vs_offline OUT

Prints, as JSON: output tokens/s at the highest concurrency over the offline batch's
(target at 64 >= 0.9), time to first token at concurrency 1 less the offline prefill (target
<= 5 ms), time per output token at concurrency 1 over the offline decode step (target
<= 1.10), the burst's output tokens/s over the offline batch's (target >= 0.85) and whether
it lost any request. Medians (p50) throughout.
"""
import argparse
import json
from pathlib import Path


def compare(offline: dict, bench: dict) -> dict:
    levels = {level["concurrency"]: level for level in bench["sweep"]}
    top, one = levels[max(levels)], levels.get(1)
    result = {"concurrency": top["concurrency"],
              "served_over_offline_tokens_per_s": round(top["output_tokens_per_s"]
                                                        / offline["batch_output_tokens_per_s"], 3)}
    if one is not None:
        result["ttft_minus_prefill_ms"] = round(one["ttft_ms"]["p50"] - offline["prefill_ms"], 3)
        result["tpot_over_decode_step"] = round(one["tpot_ms"]["p50"] / offline["decode_step_ms"], 3)
    burst = bench.get("burst")
    if burst:
        result["burst_over_offline_tokens_per_s"] = round(burst["output_tokens_per_s"]
                                                          / offline["batch_output_tokens_per_s"], 3)
        result["burst_lost"] = burst["requests"] - burst["completed"]
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    offline = json.loads((args.out / "offline.json").read_text())
    bench = json.loads((args.out / "bench.json").read_text())
    print(json.dumps(compare(offline, bench)))


if __name__ == "__main__":
    main()
