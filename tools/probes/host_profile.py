"""Where an engine's host time goes in one benchmark case: the case run on a fresh engine
each time (as the benchmark times it: created untimed, no synchronisation between calls),
timed, then again under cProfile, the profiler on only while the case runs (Python functions
by their own time; a C call's time counts in its caller).

    python -m tools.probes.host_profile --engine E --model-config C --weight-dir W [--case decode] [--repeats 50]
"""
import cProfile
import json
import pstats
import statistics

import torch

from contract.loader import load_engine_module
from fitness.bench import CASE_SEED, timed_run
from fitness.cases import select_cases
from fitness.traces import materialize
from tools.profile_case import case_arguments


def timed_case(engine, calls, profiler=None) -> float:
    """The benchmark's timed run of the calls, with `profiler` on around it when given."""
    if profiler is None:
        return timed_run(engine, calls, "cuda")
    profiler.enable()
    try:
        return timed_run(engine, calls, "cuda")
    finally:
        profiler.disable()


def main(argv=None) -> int:
    parser = case_arguments(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--top", type=int, default=22, help="functions listed")
    args = parser.parse_args(argv)
    config = json.loads(args.model_config.read_text())
    module = load_engine_module(args.engine)
    cases = select_cases(args.cases)
    for name in args.case or ["decode"]:
        calls = materialize(cases[name], config["vocab_size"], CASE_SEED, "cuda")
        make = lambda: module.create_engine(dict(config), str(args.weight_dir), "cuda")  # noqa: E731
        with torch.no_grad():
            warm = make()
            timed_case(warm, calls)
            plain = [timed_case(make(), calls) for _ in range(args.repeats)]
            profiler = cProfile.Profile()
            profiled = [timed_case(make(), calls, profiler) for _ in range(args.repeats)]
            del warm
        print(f"{args.engine} {name}: {statistics.median(plain) * 1e3:.3f} ms a case on a fresh engine "
              f"(min {min(plain) * 1e3:.3f}, max {max(plain) * 1e3:.3f}; "
              f"{statistics.median(profiled) * 1e3:.3f} under the profiler)", flush=True)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
