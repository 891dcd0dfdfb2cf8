"""The throughput benchmark: the contract's protocol to the letter.

Per case: one warm-up engine runs the events `warmup` times; then `repeat` times a fresh
engine runs them once, timed between two device synchronisations under no_grad, inputs
drawn beforehand. The median run is reported, with peak memory over the timed runs
while the warm-up engine is still alive.

It trusts the engine, as the contract's protocol does: the engine runs in this process,
beside the clock and its inputs. Untrusted code is judged by `python -m fitness judge`
(fitness/README.md).

    python -m fitness bench [--engine E] [--model-config C] [--weight-dir W]
        [--device auto|cpu|cuda] [--cases public|hidden|all] [--warmup 1] [--repeat 3]
        [--roofline [--gpu auto|h100|h200]] [--step-time] [--one-engine]

--step-time adds, to each case that decodes one fixed batch (`decode_events`), the time of
a decode step alone: in each fresh engine's run the steps are timed apart from the prefill
before them (a synchronisation between), and the median run's steps are divided by their
count. `tools.transformers_bench` times generate's steps apart from its prefill the same
way, so the two tools' step figures stand side by side. (Subtracting a separate run of the
prefill alone, as both did before, let the prefill's noise into the step: Qwen3's batch-64
step read 2.6-3.6 ms on one H100, docs/log/2026-11-26-llama-batch-1-roofline-bf16-swiglu.md;
transformers' Llama 11.0-15.0 ms, docs/log/2026-11-28-transformers-steps-apart-llama-64-row.md.)

--one-engine drops the warm-up engine before the fresh ones are made, for a model the device
holds once (Qwen3.5-35B-A3B on one H200).
"""
import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from fitness import roofline
# The cases live in fitness.cases, shared with the roofline; callers may take them from here.
from contract.checkpoint import check_weight_files
from contract.devices import DEVICE_CHOICES, is_cuda, ramp_gpu_clocks, resolve_device
from contract.loader import SEED_ENGINE, load_engine_module
from contract.model_config import ConfigError, ModelConfig
from fitness.cases import CASE_SETS, hidden_style_cases, public_cases, select_cases
from fitness.traces import count_tokens, materialize, replay

ROOT = Path(__file__).resolve().parents[1]
CASE_SEED = 0  # the contract's seed for benchmark inputs


def synchronize(device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize()


def run_calls(engine, calls) -> None:
    for call in calls:
        replay(engine, call)


def timed_run(engine, calls, device) -> float:
    """Seconds for one pass over the calls, from an idle device to an idle device."""
    synchronize(device)
    start = time.perf_counter()
    run_calls(engine, calls)
    synchronize(device)
    return time.perf_counter() - start


def fresh_engine_runs(module, config_dict, weight_dir, device, calls, warmup=1, repeat=3,
                      timed=timed_run, one_engine=False) -> tuple:
    """The contract's protocol: a warm-up engine runs the calls `warmup` times and stays
    alive; then `repeat` fresh engines each run them once, measured by `timed(engine,
    calls, device)`. (the seconds of each run, peak bytes over the fresh engines, bytes the
    warm-up engine holds beside them.) `one_engine`: the warm-up engine is dropped first,
    for a model that fits the device once."""
    cuda = is_cuda(device)
    with torch.no_grad():
        warm_engine = module.create_engine(config_dict, str(weight_dir), device)
        for _ in range(warmup):
            run_calls(warm_engine, calls)
        if one_engine:
            warm_engine = None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        warm_bytes = torch.cuda.memory_allocated() if cuda else 0
        times = []
        for _ in range(repeat):
            engine = module.create_engine(config_dict, str(weight_dir), device)
            times.append(timed(engine, calls, device))
            del engine  # as the evaluator does: dropped, no empty_cache
        peak_bytes = torch.cuda.max_memory_allocated() if cuda else 0
        del warm_engine
    return times, peak_bytes, warm_bytes


def run_case(module, config_dict, weight_dir, device, events, seed=CASE_SEED, warmup=1, repeat=3,
             *, case_name: str = "", one_engine=False) -> dict:
    """The contract's result dict for one case; `config_dict` goes to the engine untouched."""
    calls = materialize(events, config_dict["vocab_size"], seed, device)
    times, peak_bytes, warm_bytes = fresh_engine_runs(module, config_dict, weight_dir, device, calls, warmup, repeat,
                                                      one_engine=one_engine)
    seconds = statistics.median(times)
    prefill_tokens, decode_tokens = count_tokens(events)
    return {
        "case_name": case_name,
        "elapsed_ms": seconds * 1e3,
        "prefill_tokens": prefill_tokens,
        "decode_tokens": decode_tokens,
        "total_tokens": prefill_tokens + decode_tokens,
        "tokens_per_second": (prefill_tokens + decode_tokens) / seconds,
        "decode_tokens_per_second": decode_tokens / seconds,
        "peak_memory_mb": peak_bytes / 2**20,
        # The contract's peak holds two engines (the warm-up one lives on); one engine's own
        # is what a server running it needs, comparable with a library's single model.
        "engine_peak_mb": (peak_bytes - warm_bytes) / 2**20,
        "run_ms": [t * 1e3 for t in times],  # each fresh engine's run, in order: the median's spread
    }


def run_benchmark(module, config_dict, weight_dir, device, cases: dict, warmup=1, repeat=3, one_engine=False) -> list:
    """One result dict per case, in the order of `cases`, after ramping the GPU's clocks."""
    ramp_gpu_clocks(device)
    return [run_case(module, config_dict, weight_dir, device, events, warmup=warmup, repeat=repeat,
                     case_name=name, one_engine=one_engine)
            for name, events in cases.items()]


def add_roofline(results: list, config: ModelConfig, cases: dict, gpu: str) -> None:
    for result in results:
        events = cases[result["case_name"]]
        bound = roofline.case_bound(config, events, gpu)
        result["roofline_tokens_per_second"] = bound["tokens_per_second"]
        result["fraction_of_roofline"] = result["tokens_per_second"] / bound["tokens_per_second"]
        if "ms_per_decode_step" in result:  # only fixed-batch decode cases have one
            steps_s = bound["seconds"] - roofline.case_bound(config, without_steps(events), gpu)["seconds"]
            result["roofline_ms_per_decode_step"] = steps_s * 1e3 / fixed_batch_steps(events)
            result["fraction_of_step_roofline"] = result["roofline_ms_per_decode_step"] / result["ms_per_decode_step"]


def fixed_batch_steps(events) -> int:
    """How many decode steps `events` takes of one unchanging batch, between its prefill and
    its removal (a `decode_events` case); 0 for any other schedule."""
    if len(events) < 3 or events[0].kind != "prefill" or events[-1].kind != "remove":
        return 0
    steps, batch = events[1:-1], events[0].request_ids
    return len(steps) if all(e.kind == "decode" and e.request_ids == batch for e in steps) else 0


def without_steps(events) -> list:
    return [e for e in events if e.kind != "decode"]


def add_step_times(results: list, module, config_dict, weight_dir, device, cases: dict, warmup=1,
                   repeat=3, one_engine=False) -> None:
    """`ms_per_decode_step` for each fixed-batch decode case (see the module's docstring)."""
    for result in results:
        events = cases[result["case_name"]]
        steps = fixed_batch_steps(events)
        if steps:
            calls = materialize(events, config_dict["vocab_size"], CASE_SEED, device)
            times, _, _ = fresh_engine_runs(module, config_dict, weight_dir, device, calls, warmup, repeat,
                                         timed=timed_steps, one_engine=one_engine)
            result["ms_per_decode_step"] = statistics.median(times) * 1e3 / steps


def timed_steps(engine, calls, device) -> float:
    """Seconds of a fixed-batch case's decode steps alone: its prefill runs before them and
    its removal after, untimed (timed_run synchronises before the steps)."""
    prefill, *steps, remove = calls
    run_calls(engine, [prefill])
    seconds = timed_run(engine, steps, device)
    run_calls(engine, [remove])
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", type=Path, default=SEED_ENGINE)
    parser.add_argument("--model-config", type=Path, default=ROOT / "target" / "model_config.json")
    parser.add_argument("--weight-dir", type=Path, default=ROOT / "target" / "weights")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    parser.add_argument("--cases", choices=CASE_SETS, default="public")
    parser.add_argument("--case", action="append", metavar="NAME",
                        help="only this case of the set (repeatable; default: every case)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--roofline", action="store_true",
                        help="add each case's speed-of-light tokens/s and the fraction reached")
    parser.add_argument("--gpu", choices=("auto", *sorted(roofline.GPUS)), default="auto",
                        help="the GPU the roofline assumes; auto reads the device's name")
    parser.add_argument("--step-time", action="store_true",
                        help="add ms_per_decode_step to each case that decodes one fixed batch")
    parser.add_argument("--one-engine", action="store_true",
                        help="drop the warm-up engine before the fresh ones are made (a model that "
                             "fits the device once; the contract keeps it alive)")


def cli(args) -> int:
    """`python -m fitness bench`: the contract's JSON list on stdout."""
    try:
        raw_config = json.loads(Path(args.model_config).read_text())
        config = ModelConfig.from_dict(raw_config)
        check_weight_files(config, args.weight_dir)  # a clear message now, not a crash later
    except (OSError, json.JSONDecodeError, ConfigError) as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2
    cases = select_cases(args.cases)
    unknown = sorted(set(args.case or ()) - set(cases))
    if unknown:
        print(f"bench: no case {', '.join(unknown)} in {args.cases!r} (its cases: {', '.join(cases)})", file=sys.stderr)
        return 2
    cases = {name: events for name, events in cases.items() if not args.case or name in args.case}
    device = resolve_device(args.device)
    module = load_engine_module(args.engine)
    results = run_benchmark(module, raw_config, args.weight_dir, device, cases, args.warmup, args.repeat,
                            args.one_engine)
    if args.step_time:
        add_step_times(results, module, raw_config, args.weight_dir, device, cases, args.warmup, args.repeat,
                       args.one_engine)
    if args.roofline:
        gpu = roofline.gpu_for_device(device) if args.gpu == "auto" else args.gpu
        add_roofline(results, config, cases, gpu)
    print(json.dumps(results, indent=2))
    return 0
