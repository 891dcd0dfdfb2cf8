"""Where a timed run's seconds go between the benchmark's clock and the judge's, per case.

    python -m tools.timed_run_overhead --engine E [--rounds 5] [--gap 1.0] [--cases public] [--case NAME] [--variants V ...]
        [--profile] [--timeline] [--timeline-json FILE]

Each variant times the same case on a fresh engine (a warm-up engine alive), `--rounds`
times, and prints the median and range in ms. The variants in this process take turns
round by round (the order turned each round); the judged ones run one after another:
  bench       in this process: synchronise, the calls, synchronise (fitness.bench)
  bench_held  `bench` with every output held to the run's end (as a staged run holds them)
  bench_pinned  `bench` with this process's main thread on one core of its own (as a runner's
              on its timing core) and one intra-op thread
  here_staged in this process: the runner's staged run without its process and messages
              (Runner.stage for each call off the clock, then Runner.run_staged and the checksum)
  go          in this process: the runner's `prepare` ending, then each call as the runner
              takes it (its inputs written to the slot and seen from the device, a copy of
              its output), the checksum: the judge's run without the other process
  go_copied   `go` with each call's inputs copied to the device, not seen there in place
  go_staged   `go` with each call's inputs copied to the device on a stream of their own,
              which the engine's stream waits for (the copy overlaps the call before)
  go_stream_writes  `go` with each call's inputs written to the device by the stream itself when
              due (tools.probes.input_delivery; a call of more than STREAM_WRITES_MOST values
              is seen mapped as in `go`)
  go_kernel_copied  `go` with each call's inputs copied to a device region of their own by a
              kernel that reads them from the mapped slot (the engine's own copies then stay
              on the device)
  go_no_wire  `go` with every header decoded and every input in the slot before the clock
  go_device_inputs  `go` with each call's inputs on the device before the clock (no view)
  go_no_copy  `go` without the copy of each output and the checksum (a synchronisation ends it)
  go_parts    `go` with the host's seconds of each part added up per run (wire, views,
              engine, copy): printed as a second line
  bench_parts `bench` with the host's seconds in the engine's calls added up per run
  judge       a runner idle `--gap` s, then the judge's run on its stage: the engine made there,
              then each call sent when due (fitness.judge.RunnerDriver.go)
  judge_now   the same with no gap: the runner is still polling when `go` comes
  judge_apart `judge` as the judge ran until its engines were made on the stage: the engine made
              on the runner's home core `--gap` s before, a 20 ms clock burst before the run
  judge_staged  `--gap` s idle, then a final's second timing: the engine made on the stage, every
              call staged before the clock (fitness.judge.RunnerDriver.go, staged: the evaluator's
              protocol in a runner)
  judge_staged_apart  `judge_staged` with its engine made on the runner's home core `--gap` s
              before the run, as finals made them until their engines were made on the stage
  judge_staged_nap  `judge_staged` with the judge napping 50 us at a time while it waits, not
              spinning on a core that may share a physical core with the runner's
  judge_home  `judge` timed on the runner's own core (it is not moved to the timing core)
  ping        one request and its answer through the pipe: one the runner refuses at once
--profile adds an untimed run of each in-process variant under torch.profiler; --timeline one
with CUDA events around each engine call (the device's time inside the calls and between them;
--timeline-json writes each call's figures, per case and variant).
"""
import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import fitness.wire
from contract.devices import core_siblings, ramp_gpu_clocks
from contract.loader import load_engine_module
from fitness.bench import synchronize, timed_run
from fitness.candidate import CandidateError, CandidateProcess
from fitness.cases import select_cases
from fitness.judge import RunnerDriver, Stage, TimingCores, kept_off
from fitness.runner import Runner
from fitness.traces import call_message, materialize, replay
from fitness.wire import Slot, decode_call
from tools.arguments import target_arguments


class Parts:
    """Host seconds per part of a run, added up call by call (go_parts, bench_parts)."""

    def __init__(self):
        self.runs = []

    def start(self) -> None:
        self.runs.append({})

    def timed(self, part, fn):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                run = self.runs[-1]
                run[part] = run.get(part, 0.0) + time.perf_counter() - started
        return call

    def summary(self) -> str:
        parts = sorted({part for run in self.runs for part in run})
        return ", ".join(f"{part} {statistics.median(run.get(part, 0.0) for run in self.runs) * 1e3:.3f}"
                         for part in parts) + " ms a run (host, median)"


class Timeline:
    """CUDA events on the current stream around each of an engine's calls in one run
    (--timeline): where the device's time goes, inside the engine's calls or between them (the
    runner's wire, views and output copies), beside the host's. A stream reaches an event
    when the work before it is done, or when the host records it if the device is idle."""

    def __init__(self, engine):
        self.marks = []  # per call: its kind, host start, host end, start event, end event
        wrap_calls(engine, self.marked)

    def marked(self, fn):
        def call(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            host = time.perf_counter()
            start.record()
            try:
                return fn(*args, **kwargs)
            finally:
                end.record()
                self.marks.append((fn.__name__, host, time.perf_counter(), start, end))
        return call

    def calls(self) -> list:
        """Each call's kind and us: inside it (device, host) and before it since the last ended."""
        torch.cuda.synchronize()
        rows = []
        for i, (kind, host, host_end, start, end) in enumerate(self.marks):
            row = {"kind": kind, "device_inside": start.elapsed_time(end) * 1e3, "host_inside": (host_end - host) * 1e6}
            if i:
                _, _, before_end, _, before = self.marks[i - 1]
                row.update(device_before=before.elapsed_time(start) * 1e3, host_before=(host - before_end) * 1e6)
            rows.append(row)
        return rows

    def summary(self) -> str:
        """In a line: us inside the calls and between them, device and host, summed over the
        run and the median call."""
        rows = self.calls()
        spans = {"device inside": [r["device_inside"] for r in rows],
                 "device between": [r["device_before"] for r in rows[1:]],
                 "host inside": [r["host_inside"] for r in rows],
                 "host between": [r["host_before"] for r in rows[1:]]}
        return f"{len(rows)} calls; " + ", ".join(
            f"{name} {sum(us):.0f} us (a call {statistics.median(us) if us else 0:.1f})" for name, us in spans.items())


def wrap_calls(engine, wrap) -> None:
    """Each of the engine's calls through `wrap(method)` (an attribute on the instance shadows
    the class's method)."""
    for name in ("prefill", "decode", "remove"):
        setattr(engine, name, wrap(getattr(engine, name)))


def timed_engine(engine, parts: Parts):
    """The engine with its calls' host seconds added to `parts`."""
    wrap_calls(engine, functools.partial(parts.timed, "engine"))
    return engine


class AheadInputs:
    """Each call's inputs on the device before the run (go_device_inputs), looked up by start."""

    def __init__(self, planned, device):
        self.device = device
        self.by_start = {start: torch.from_numpy(values.copy()).to(device)
                         for _, start, values in planned if values is not None and len(values)}

    def view(self, start: int, count: int) -> torch.Tensor:
        return self.by_start[start] if count else torch.empty(0, dtype=torch.long, device=self.device)


class StagedInputs:
    """Each call's inputs copied from the slot (pinned) to a device region of their own on a
    side stream as the call comes; the engine's stream waits for the copy (go_staged)."""

    def __init__(self, inputs, device):
        self.host, self.device = inputs.host, device
        self.staged = torch.empty_like(inputs.host, device=device)
        self.stream = torch.cuda.Stream(device)

    def view(self, start: int, count: int) -> torch.Tensor:
        place = self.staged[start:start + count]
        with torch.cuda.stream(self.stream):
            place.copy_(self.host[start:start + count], non_blocking=True)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return place


class KernelCopiedInputs:
    """Each call's inputs copied by a kernel from the slot's mapped view into a device region
    of their own as the call comes (go_kernel_copied)."""

    def __init__(self, inputs, device):
        self.inputs = inputs
        self.staged = torch.empty_like(inputs.host, device=device)

    def view(self, start: int, count: int) -> torch.Tensor:
        return torch.add(self.inputs.view(start, count), 0, out=self.staged[start:start + count])


STREAM_WRITES_MOST = 1024  # values; a larger call (a prefill's) is seen mapped


class StreamWrittenInputs:
    """Each call's inputs written from the slot into a device region of their own by stream
    memory operations as the call comes (go_stream_writes)."""

    def __init__(self, inputs, device):
        from tools.probes.input_delivery import StreamWrites
        self.inputs = inputs
        self.host = inputs.host.numpy()
        self.writes = StreamWrites(torch.empty_like(inputs.host, device=device))

    def view(self, start: int, count: int) -> torch.Tensor:
        if count > STREAM_WRITES_MOST:
            return self.inputs.view(start, count)
        return self.writes.write(start, self.host[start:start + count])


def bench_run(engine, calls, device, variant) -> float:
    """Seconds of the evaluator's loop (`bench`), or of its `bench_held` or `bench_pinned` form."""
    if variant == "bench_held":
        synchronize(device)
        started = time.perf_counter()
        held = [replay(engine, call) for call in calls]  # noqa: F841 (alive to the clock's end)
        synchronize(device)
        return time.perf_counter() - started
    if variant == "bench_pinned":
        cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
        os.sched_setaffinity(0, {max(cores)})  # this thread alone: torch's own threads stay put
        torch.set_num_threads(1)
        try:
            return timed_run(engine, calls, device)
        finally:
            os.sched_setaffinity(0, cores)
            torch.set_num_threads(threads)
    return timed_run(engine, calls, device)


def here_staged_run(runner, slot, planned, device) -> float:
    """Seconds of a staged run as the runner makes it, in this process (here_staged)."""
    for payload, start, values in planned:
        slot.inputs[start:start + len(values)] = values
        runner.stage(decode_call(payload))
    synchronize(device)
    started = time.perf_counter()
    runner.run_staged()
    runner.copies.checksum()  # its .item(): the device is idle after it
    return time.perf_counter() - started


def go_run(runner, slot, planned, device, variant, parts, staged) -> float:
    """Seconds of one run through the runner's path, less what `variant` leaves out."""
    inputs, copies = runner.inputs, runner.copies
    mapped = inputs.on_device
    if variant == "go_copied":  # each call's inputs copied to the device (pinned: no wait)
        inputs.on_device = None
    elif variant == "go_device_inputs":
        runner.inputs = AheadInputs(planned, device)
    elif variant in STAGINGS:  # inputs of the variant's own making
        runner.inputs = staged
    if variant == "go_no_copy":
        copies.keep = copies.outputs.append
    if variant == "go_parts":
        runner.inputs.view = parts.timed("views", runner.inputs.view)
        copies.keep = parts.timed("copy", copies.keep)
        timed_engine(runner.engine, parts)
        parts.start()
    headers = None
    if variant == "go_no_wire":
        for _, start, values in planned:
            slot.inputs[start:start + len(values)] = values
        headers = [decode_call(payload) for payload, _, _ in planned]
    deliver = parts.timed("wire", slot.send) if variant == "go_parts" else slot.send
    take = parts.timed("wire", slot.calls.take) if variant == "go_parts" else slot.calls.take
    synchronize(device)
    started = time.perf_counter()
    if headers:
        for header in headers:
            runner.call(header)
    else:
        for payload, start, values in planned:
            deliver(payload, start, values)
            runner.call(decode_call(take()))
    if variant == "go_no_copy":
        synchronize(device)
    else:
        copies.checksum()  # its .item(): the device is idle after it
    seconds = time.perf_counter() - started
    runner.inputs, inputs.on_device = inputs, mapped
    copies.__dict__.pop("keep", None)
    inputs.__dict__.pop("view", None)
    return seconds


def profiled_summary(prof) -> str:
    """One run under torch.profiler, in a line: the device's busy time and span, the gaps
    between its work longer than 5 us, its copies by kind, and the host's CUDA runtime calls
    (count, total us)."""
    host, busy, spans, copies = {}, 0.0, [], {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            spans.append((event.time_range.start, event.time_range.end))
            if event.name.startswith("Memcpy"):
                count, total = copies.get(event.name, (0, 0.0))
                copies[event.name] = (count + 1, total + event.time_range.elapsed_us())
        elif event.name.startswith("cuda") and not event.name.startswith("cudaGetDevice"):
            count, total = host.get(event.name, (0, 0.0))
            host[event.name] = (count + 1, total + event.time_range.elapsed_us())
    spans.sort()
    gaps, reach = [], spans[0][1] if spans else 0
    for start, end in spans:
        if start - reach > 5:
            gaps.append(start - reach)
        busy += max(0, end - max(start, reach))
        reach = max(reach, end)
    calls = ", ".join(f"{name} {count} {total:.0f}" for name, (count, total) in
                      sorted(host.items(), key=lambda item: -item[1][1])[:6])
    span = reach - spans[0][0] if spans else 0
    copied = ", ".join(f"{name} {count} {total:.0f}" for name, (count, total) in sorted(copies.items()))
    return (f"device busy {busy:.0f} us of a {span:.0f} us span, {len(gaps)} gaps > 5 us ({sum(gaps):.0f} us); "
            f"copies (count, us): {copied}; host (count, us): {calls}")


def in_process(slot, module, raw_config, weight_dir, device, events, rounds, variants, profile=False,
               timeline=False, timelines=None) -> dict:
    """variant -> seconds of its runs, the variants taking turns round by round; with `profile`,
    one more round, each run under torch.profiler, summarised (profiled_summary); with
    `timeline`, one more, each run's calls between CUDA events (Timeline), each variant's
    calls (Timeline.calls) put in `timelines` when given."""
    messages = [call_message(call) for call in materialize(events, raw_config["vocab_size"], 0, "cpu")]
    calls = materialize(events, raw_config["vocab_size"], 0, device)
    runner = Runner(slot)
    runner.module, runner.device = module, device
    seconds, parts, staged = {variant: [] for variant in variants}, {v: Parts() for v in variants}, {}
    with torch.no_grad():
        warm = module.create_engine(dict(raw_config), str(weight_dir), device)
        timed_run(warm, calls, device)
        for i in range(rounds + profile + timeline):
            for variant in variants[i % len(variants):] + variants[:i % len(variants)]:
                engine = module.create_engine(dict(raw_config), str(weight_dir), device)
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA]) \
                    if profile and i == rounds else None
                marks = Timeline(engine) if timeline and i == rounds + profile else None
                if variant.startswith("bench"):
                    if variant == "bench_parts":
                        timed_engine(engine, parts[variant])
                        parts[variant].start()
                    with prof or contextlib.nullcontext():
                        seconds[variant].append(bench_run(engine, calls, device, variant))
                else:
                    runner.engine = engine
                    runner.ready(device)  # as the runner's `prepare` ends
                    if variant in STAGINGS and variant not in staged:
                        staged[variant] = STAGINGS[variant](runner.inputs, device)
                    planned = slot.plan(messages)[:-1]  # the run's calls, less its end
                    with prof or contextlib.nullcontext():
                        if variant == "here_staged":
                            seconds[variant].append(here_staged_run(runner, slot, planned, device))
                        else:
                            seconds[variant].append(go_run(runner, slot, planned, device, variant,
                                                           parts[variant], staged.get(variant)))
                if prof is not None or marks is not None:
                    seconds[variant].pop()  # a profiled or marked run is not timed
                    summary = profiled_summary(prof) if prof is not None else marks.summary()
                    if marks is not None and timelines is not None:
                        timelines[variant] = marks.calls()
                    print(f"  {variant} {'profiled' if prof is not None else 'timeline'}: {summary}", flush=True)
                runner.engine = engine = None
        del warm
    for variant, kept in parts.items():
        if kept.runs:
            print(f"  {variant}: {kept.summary()}", flush=True)
    return seconds


def judged(engine_path, raw_config, weight_dir, device, events, rounds, gap, variant="judge") -> list:
    process = CandidateProcess(device, {"OMP_NUM_THREADS": "1"})
    cores = sorted(os.sched_getaffinity(0))
    # judge_home: timed on the runner's own core, so the timed run does not move it.
    timing = TimingCores([cores[0]] if variant == "judge_home" else cores)
    stage = (NappingStage if variant.endswith("_nap") else Stage)(device, timing)
    driver = RunnerDriver(process, device, time.monotonic() + 600, cores[0], stage)
    longest_nap = fitness.wire.MAX_NAP_S
    if variant.endswith("_nap"):  # every nap as short as the first: the run's end is seen within ~0.1 ms
        fitness.wire.MAX_NAP_S = fitness.wire.NAP_S
    try:
        driver.place(cores[0])  # as the judge loads: on the runner's home core, one thread
        process.loaded(vouched=True)  # the repository's programs: their kernels join the shared cache
        process.request("load", 120, path=str(Path(engine_path).resolve()), source=Path(engine_path).read_text(),
                        threads=1)
        driver.run_trace(raw_config, weight_dir, events, 0)  # the warm-up engine
        seconds = []
        for i in range(rounds):
            if variant == "ping":  # a request the runner refuses at once, waited on as a run is
                seconds.append(pinged(driver, raw_config, weight_dir, gap))
                continue
            if variant.endswith("_apart"):
                driver.prepare(raw_config, weight_dir)()
                time.sleep(gap)
                seconds.append(run_apart(driver, events, i + 1, staged=variant == "judge_staged_apart"))
            else:
                time.sleep(gap)
                seconds.append(driver.go(raw_config, weight_dir, events, i + 1, staged=variant.startswith("judge_staged")))
            driver.fetch(events)
        return seconds
    finally:
        fitness.wire.MAX_NAP_S = longest_nap
        process.close()


def run_apart(driver, events, seed: int, staged: bool) -> float:
    """A run on the engine `prepare` made before it (on the runner's home core), on the stage;
    the judge's own runs had a 20 ms clock burst first (judge_apart), staged ones none."""
    planned = driver.planned(events, seed)
    with driver.stage.alone(driver) as awake:
        if not staged:
            ramp_gpu_clocks(driver.device, 0.02)
        run = driver.process.staged_run if staged else driver.process.timed_run
        driver.last_seconds, driver.last_checksum = run(planned, driver.left(), awake)
    return driver.last_seconds


def pinged(driver, raw_config, weight_dir, gap: float) -> float:
    """The seconds of one `ping` the runner refuses at once, sent from the stage as a run is."""
    driver.prepare(raw_config, weight_dir)()
    time.sleep(gap)
    process, cpu = driver.process, driver.stage.timing.current()
    process.timed_run(process.slot.plan([]), 60, True)  # the run after `prepare`: no calls, its end
    driver.place(cpu)
    with kept_off(core_siblings(cpu)):  # the judge off the runner's core, as on the stage
        started = time.perf_counter()
        try:
            process.send("ping", 60, awake=True)()
        except CandidateError:
            pass
        return time.perf_counter() - started


class NappingStage(Stage):
    """A Stage whose judge naps while its run goes on (judge_staged_nap), never waiting busy."""

    @contextlib.contextmanager
    def alone(self, driver):
        with super().alone(driver):
            yield False


# The variants that hand the engine inputs of their own making: variant -> its maker(inputs, device).
STAGINGS = {"go_staged": StagedInputs, "go_stream_writes": StreamWrittenInputs, "go_kernel_copied": KernelCopiedInputs}
IN_PROCESS = ("bench", "bench_held", "bench_pinned", "bench_parts", "here_staged", "go", "go_copied", "go_staged",
              "go_stream_writes", "go_kernel_copied", "go_no_wire", "go_device_inputs", "go_no_copy", "go_parts")
JUDGED = ("judge", "judge_now", "judge_apart", "judge_staged", "judge_staged_apart", "judge_staged_nap",
          "judge_home", "ping")


def report(engine, case, variant, seconds) -> None:
    ms = [s * 1e3 for s in seconds]
    print(f"{engine.name} {case:8s} {variant:16s} median {statistics.median(ms):7.3f} ms "
          f"(min {min(ms):.3f}, max {max(ms):.3f}) over {len(ms)}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.timed_run_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    target_arguments(parser, device="cuda")
    parser.add_argument("--cases", default="public")
    parser.add_argument("--case", action="append", metavar="NAME", help="only this case of --cases (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gap", type=float, default=1.0)
    parser.add_argument("--variants", nargs="*", help="the variants to run (default: all)")
    parser.add_argument("--profile", action="store_true",
                        help="then one run of each in-process variant under torch.profiler, summarised")
    parser.add_argument("--timeline", action="store_true",
                        help="then one run of each in-process variant with CUDA events around each engine call")
    parser.add_argument("--timeline-json", type=Path, help="with --timeline: each call's figures to FILE, per case and variant")
    args = parser.parse_args(argv)
    raw_config = json.loads(args.model_config.read_text())
    weight_dir = args.weight_dir.resolve()
    module = load_engine_module(args.engine)
    slot = Slot()  # one for the process: its inputs are mapped into the device's space once
    chosen = args.variants or IN_PROCESS + JUDGED
    timelines = {}  # case -> variant -> calls
    for name, events in select_cases(args.cases).items():
        if args.case and name not in args.case:
            continue
        here = [variant for variant in IN_PROCESS if variant in chosen]
        if here:
            ran = in_process(slot, module, raw_config, weight_dir, args.device, events, args.rounds, here, args.profile,
                             args.timeline, timelines.setdefault(name, {}))
            for variant in here:
                report(args.engine, name, variant, ran[variant])
        judge = functools.partial(judged, args.engine, raw_config, weight_dir, args.device, events, args.rounds)
        for variant in (v for v in JUDGED if v in chosen):
            gap = 0.0 if variant == "judge_now" else args.gap
            report(args.engine, name, variant, judge(gap, "judge" if variant == "judge_now" else variant))
    if args.timeline_json:
        args.timeline_json.write_text(json.dumps(timelines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
