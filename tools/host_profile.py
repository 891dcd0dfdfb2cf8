"""Where an engine's host time goes: the public decode case run many times on one warm
engine, with no synchronisation between calls (as the benchmark runs it), timed, then again
under cProfile (Python functions by their own time; a C call's time counts in its caller).

    python -m tools.host_profile --engine E --model-config C --weight-dir W [--repeats 50]
"""
import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path

import torch

from fitness.loader import load_engine_module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--weight-dir", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--top", type=int, default=22, help="functions listed")
    args = parser.parse_args(argv)
    config = json.loads(args.model_config.read_text())
    engine = load_engine_module(args.engine).create_engine(config, str(args.weight_dir), "cuda")
    generator = torch.Generator().manual_seed(0)
    ids = list(range(8))
    prompts = [torch.randint(0, config["vocab_size"], (32,), generator=generator).cuda() for _ in ids]
    tokens = torch.randint(0, config["vocab_size"], (len(ids),), generator=generator).cuda()

    def case():  # the public decode case: 8 prompts of 32, 16 steps of all 8, remove
        engine.prefill(ids, prompts)
        for _ in range(16):
            engine.decode(ids, tokens)
        engine.remove(ids)

    with torch.no_grad():
        for _ in range(5):
            case()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(args.repeats):
            case()
        torch.cuda.synchronize()
        print(f"{args.engine}: {(time.perf_counter() - started) / args.repeats * 1e3:.3f} ms a decode case "
              "(no profiler)", flush=True)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.repeats):
            case()
        torch.cuda.synchronize()
        profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
