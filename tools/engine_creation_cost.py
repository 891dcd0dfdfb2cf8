"""What making an engine costs, beside what running a case costs.

First measured in docs/log/2026-11-22-where-a-judgements-seconds-go.md.

    python -m tools.engine_creation_cost --engines seed_engine/engine.py FAST.py [--repeats 5]

In this process (a measuring tool, not a judge): the checkpoint's torch.load alone, then
per engine `create_engine` `--repeats` times and each public case's calls on a fresh
engine, medians in milliseconds. A judgement makes ~20 engines, so this says whether the
engines or the calls are its bulk.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from contract.devices import resolve_device
from contract.loader import load_engine_module
from fitness.bench import synchronize
from fitness.cases import select_cases
from fitness.traces import materialize, replay
from tools.arguments import target_arguments


def milliseconds(fn, repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.engine_creation_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", type=Path, required=True)
    target_arguments(parser, device="auto")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    config = json.loads(args.model_config.read_text())
    checkpoint = args.weight_dir / "model.pt"
    load = lambda: torch.load(checkpoint, map_location="cpu", weights_only=True)  # noqa: E731
    print(json.dumps({"what": "torch.load", "ms": milliseconds(load, args.repeats, device)}), flush=True)
    cases = select_cases("public")
    for path in args.engines:
        module = load_engine_module(str(path))
        make = lambda: module.create_engine(dict(config), str(args.weight_dir), device)  # noqa: E731
        with torch.no_grad():
            make()  # JIT and first-touch costs, as a warm-up engine pays them
            row = {"engine": str(path), "create_ms": milliseconds(make, args.repeats, device)}
            for name, events in cases.items():
                def run(events=events):
                    engine = make()
                    for call in materialize(events, config["vocab_size"], 0, device):
                        replay(engine, call)
                row[f"{name}_with_create_ms"] = milliseconds(run, args.repeats, device)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
