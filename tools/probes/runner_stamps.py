"""Where the runner's host time goes between an engine's calls, step by step, in a timed run
(issue 58): a clock read after each step of a call's path as `fitness.runner.Runner.call`
takes it (the judge's send, the take, the header, the view of the inputs, the request ids
and tokens, the engine, the kept copy), each figure the median over calls and runs. Then
the same view and copy alone in a tight loop, and each one right after an engine call, to
tell what a step costs from what a step costs where it falls in a run.

    python -m tools.probes.runner_stamps --engine E [--model-config C --weight-dir W] [--case decode] [--runs 7] [--device cuda]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from contract.loader import load_engine_module
from fitness.bench import replay, synchronize, timed_run
from fitness.cases import select_cases
from fitness.runner import Runner
from fitness.traces import call_message, materialize
from fitness.wire import Slot, decode_call
from tools.arguments import target_arguments

STEPS = ("send", "take", "header", "view", "split", "engine", "keep")


def stamped_run(runner, slot, planned, stamps: dict, device) -> float:
    """One run through the runner's path, each step's ns appended to `stamps[step]`; its seconds."""
    ns = time.perf_counter_ns
    synchronize(device)
    started = time.perf_counter()
    for index, (payload, start, values) in enumerate(planned):
        t0 = ns()
        slot.send(payload, start, values)
        t1 = ns()
        raw = slot.calls.take()
        t2 = ns()
        header = decode_call(raw)
        t3 = ns()
        values = runner.inputs.view(header.start, header.count)
        t4 = ns()
        ids, tokens = runner.arguments(header, values)
        t5 = ns()
        out = runner.invoke(header, ids, tokens, index)
        t6 = ns()
        runner.copies.keep(out)
        t7 = ns()
        for step, (a, b) in zip(STEPS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6), (t6, t7))):
            stamps[step].append(b - a)
    runner.copies.checksum()
    return time.perf_counter() - started


def after_engine(runner, planned, engine, calls, device) -> dict:
    """A view and a copy timed right after each engine call of a benchmark run (ns each), then
    the same ten times more after it (the step warm)."""
    first, warm = {"view": [], "keep": []}, {"view": [], "keep": []}
    ns = time.perf_counter_ns
    runner.copies.start(device)
    synchronize(device)
    for call, (_, start, values) in zip(calls, planned):
        out = replay(engine, call)
        if not torch.is_tensor(out):
            continue
        for i in range(11):
            t0 = ns()
            runner.inputs.view(start, len(values))
            t1 = ns()
            runner.copies.keep(out)
            t2 = ns()
            (first if i == 0 else warm)["view"].append(t1 - t0)
            (first if i == 0 else warm)["keep"].append(t2 - t1)
    synchronize(device)
    return {"first": first, "warm": warm}


def us(values) -> str:
    return f"{statistics.median(values) / 1e3:7.2f}" if values else "      -"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.runner_stamps", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    target_arguments(parser, device="cuda")
    parser.add_argument("--case", default="decode")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    config = json.loads(args.model_config.read_text())
    module = load_engine_module(args.engine)
    events = select_cases("public")[args.case]
    messages = [call_message(call) for call in materialize(events, config["vocab_size"], 0, "cpu")]
    device = args.device
    calls = materialize(events, config["vocab_size"], 0, device)
    slot = Slot()
    runner = Runner(slot)
    runner.module, runner.device = module, device
    stamps, seconds, bench = {step: [] for step in STEPS}, [], []
    with torch.no_grad():
        warm = module.create_engine(dict(config), str(args.weight_dir), device)
        timed_run(warm, calls, device)
        for _ in range(args.runs):
            engine = module.create_engine(dict(config), str(args.weight_dir), device)
            bench.append(timed_run(engine, calls, device))
            runner.engine = engine = module.create_engine(dict(config), str(args.weight_dir), device)
            runner.ready(device)
            planned = slot.plan(messages)[:-1]
            seconds.append(stamped_run(runner, slot, planned, stamps, device))
            runner.engine = engine = None
        engine = module.create_engine(dict(config), str(args.weight_dir), device)
        runner.ready(device)
        placed = after_engine(runner, slot.plan(messages)[:-1], engine, calls, device)
    print(f"{args.engine.name} {args.case}: {len(events)} calls; a run {statistics.median(seconds) * 1e3:.3f} ms "
          f"stamped, {statistics.median(bench) * 1e3:.3f} ms as the benchmark runs it (median of {args.runs})")
    print("us a call, median over calls and runs:")
    print("  " + " ".join(f"{step:>7s}" for step in STEPS))
    print("  " + " ".join(us(stamps[step]) for step in STEPS))
    between = [sum(stamps[s][i] for s in STEPS if s != "engine") for i in range(len(stamps["engine"]))]
    print(f"  the runner's own path: {us(between)} us a call (everything but the engine)")
    for where in ("first", "warm"):
        print(f"  right after an engine call, {where:5s}: view {us(placed[where]['view'])}, keep {us(placed[where]['keep'])} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
