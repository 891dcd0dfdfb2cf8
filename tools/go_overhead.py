"""Where a timed run's seconds go between the benchmark's clock and the judge's, per case.

    python -m tools.go_overhead --engine E [--rounds 5] [--gap 1.0] [--cases public] [--variants V ...]

Each variant times the same case on a fresh engine (a warm-up engine alive), `--rounds`
times, and prints the median and range in ms:
  bench       in this process: synchronise, the calls, synchronise (fitness.bench)
  go          in this process: the runner's `prepare` ending, then each call as the runner
              takes it (its inputs written to the slot and seen from the device, a copy of
              its output), the checksum: the judge's run without the other process
  go_copied   `go` with each call's inputs copied to the device, not seen there in place
  judge       a runner, `prepare`, `--gap` s idle (other contenders preparing), then the
              judge's run, each call sent when due, on its stage (fitness.judge.RunnerDriver.go)
  judge_now   the same with no gap: the runner is still polling when `go` comes
  judge_home  `judge` timed on the runner's own core (it is not moved to the timing core)
  judge_no_burst  `judge` without the GPU burst the judge makes before each timed run
  ping        one request and its answer through the pipe: one the runner refuses at once
"""
import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from fitness.bench import timed_run
import fitness.judge
from fitness.candidate import CandidateError, CandidateProcess
from fitness.cases import select_cases
from fitness.devices import core_siblings
from fitness.judge import RunnerDriver, Stage, TimingCores, kept_off
from fitness.loader import load_engine_module
from fitness.runner import Runner
from fitness.traces import call_message, materialize
from fitness.wire import Slot, decode_call


def in_process(slot, module, raw_config, weight_dir, device, events, rounds, variant) -> list:
    messages = [call_message(call) for call in materialize(events, raw_config["vocab_size"], 0, "cpu")]
    calls = materialize(events, raw_config["vocab_size"], 0, device)
    runner = Runner(slot)
    runner.module, runner.device = module, device
    seconds = []
    with torch.no_grad():
        warm = module.create_engine(dict(raw_config), str(weight_dir), device)
        timed_run(warm, calls, device)
        for _ in range(rounds):
            engine = module.create_engine(dict(raw_config), str(weight_dir), device)
            if variant == "bench":
                seconds.append(timed_run(engine, calls, device))
            else:
                runner.engine = engine
                runner.ready(device)  # as the runner's `prepare` ends
                mapped = runner.inputs.on_device
                if variant == "go_copied":  # each call's inputs copied to the device (pinned: no wait)
                    runner.inputs.on_device = None
                planned = slot.plan(messages)[:-1]  # the run's calls, less its end
                started = time.perf_counter()
                for payload, start, values in planned:
                    slot.send(payload, start, values)
                    runner.call(decode_call(slot.calls.take()))
                runner.copies.checksum()  # its .item(): the device is idle after it
                runner.inputs.on_device = mapped
                seconds.append(time.perf_counter() - started)
            del engine
        del warm
    return seconds


def judged(engine_path, raw_config, weight_dir, device, events, rounds, gap, variant="judge") -> list:
    process = CandidateProcess(device, {"OMP_NUM_THREADS": "1"})
    cores = sorted(os.sched_getaffinity(0))
    # judge_home: timed on the runner's own core, so the timed run does not move it.
    timing = TimingCores([cores[0]] if variant == "judge_home" else cores)
    driver = RunnerDriver(process, device, time.monotonic() + 600, cores[0], Stage(device, timing))
    burst = fitness.judge.ramp_gpu_clocks
    if variant == "judge_no_burst":  # no GPU burst from this process right before the run
        fitness.judge.ramp_gpu_clocks = lambda *args, **kwargs: None
    try:
        driver.place(cores[0])  # as the judge loads: on the runner's home core, one thread
        process.request("load", 120, path=str(Path(engine_path).resolve()), threads=1)
        driver.run_trace(raw_config, weight_dir, events, 0)  # the warm-up engine
        seconds = []
        for i in range(rounds):
            driver.prepare(raw_config, weight_dir)()
            time.sleep(gap)
            if variant == "ping":  # a request the runner refuses at once, waited on as `go` is
                process.timed_run([], 60, True)  # (the run after `prepare`: none)
                cpu = timing.current()
                driver.place(cpu)
                with kept_off(core_siblings(cpu)):  # the judge off the runner's core, as in `go`
                    started = time.perf_counter()
                    try:
                        process.send("ping", 60, awake=True)()
                    except CandidateError:
                        pass
                    seconds.append(time.perf_counter() - started)
                continue
            seconds.append(driver.go(events, i + 1))
            driver.fetch(events)
        return seconds
    finally:
        fitness.judge.ramp_gpu_clocks = burst
        process.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.go_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--model-config", type=Path, default=Path("target/model_config.json"))
    parser.add_argument("--weight-dir", type=Path, default=Path("target/weights"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", default="public")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gap", type=float, default=1.0)
    parser.add_argument("--variants", nargs="*", help="the variants to run (default: all)")
    args = parser.parse_args(argv)
    raw_config = json.loads(args.model_config.read_text())
    weight_dir = args.weight_dir.resolve()
    module = load_engine_module(args.engine)
    slot = Slot()  # one for the process: its inputs are mapped into the device's space once
    for name, events in select_cases(args.cases).items():
        here = functools.partial(in_process, slot, module, raw_config, weight_dir, args.device, events, args.rounds)
        judge = functools.partial(judged, args.engine, raw_config, weight_dir, args.device, events, args.rounds)
        variants = {**{variant: functools.partial(here, variant) for variant in ("bench", "go", "go_copied")},
                    "judge": functools.partial(judge, args.gap), "judge_now": functools.partial(judge, 0.0),
                    **{variant: functools.partial(judge, args.gap, variant)
                       for variant in ("judge_home", "judge_no_burst", "ping")}}
        for variant, run in variants.items():
            if args.variants and variant not in args.variants:
                continue
            ms = [s * 1e3 for s in run()]
            print(f"{args.engine.name} {name:8s} {variant:14s} median {statistics.median(ms):7.3f} ms "
                  f"(min {min(ms):.3f}, max {max(ms):.3f}) over {len(ms)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
