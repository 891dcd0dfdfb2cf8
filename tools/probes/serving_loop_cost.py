"""The serving loop's own host cost a step, without HTTP: N sequences at once through the
`LLMEngine` (the engine core's process: schedule, launch, read back, append; this one:
detokenize, hand out), over an engine file, and where this process's time goes (cProfile's
top functions). Issue 59 asks for host work off the step's critical path at 64 and 300
requests at once; this was its baseline apart from the device and the HTTP handlers
(docs/log/2026-11-28-serving-loop-host-cost.md, before the core had a process of its own).
tools/serve_timeline.py times both processes step by step, through HTTP.

    python -m tools.probes.serving_loop_cost [--engine tools/probes/fixed_step_engine.py]
        [--seqs 64 300] [--prompt-len 128] [--output-len 64] [--profile 12]

With the fixed-step engine (STEP_MS, default 0 here: nothing but the host) a step's time
is the server's own. The outboxes are drained as a handler would, by a task that takes
each output as it comes, on the same event loop.
"""
import argparse
import asyncio
import cProfile
import os
import pstats
import time
from pathlib import Path

os.environ.setdefault("STEP_MS", "0")

from serve.__main__ import build, parse_args  # noqa: E402  (STEP_MS before the engine file is read)
from serve.sampling import SamplingParams  # noqa: E402
from tools.arguments import target_arguments  # noqa: E402

HERE = Path(__file__).resolve().parent


async def serve_once(llm, num_seqs: int, prompt_len: int, output_len: int) -> tuple:
    """(seconds, steps) for num_seqs sequences submitted at once, each output_len tokens."""
    loop = asyncio.create_task(llm.run_forever())
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    prompts = [[(i * 7 + j) % 200 + 10 for j in range(prompt_len)] for i in range(num_seqs)]
    started = time.perf_counter()
    outbox, seqs = llm.submit(prompts, params)
    while not all(seq.is_finished for seq in seqs):
        await outbox.get()  # what a handler does with each output
    seconds = time.perf_counter() - started
    loop.cancel()
    return seconds, sum(len(seq.output_token_ids) for seq in seqs) / num_seqs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.serving_loop_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=HERE / "fixed_step_engine.py")
    target_arguments(parser, device="cpu")
    parser.add_argument("--seqs", type=int, nargs="+", default=[64, 300])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--profile", type=int, default=0, help="print this many of cProfile's top functions")
    args = parser.parse_args(argv)
    for num_seqs in args.seqs:
        llm, _ = build(parse_args(["--engine", str(args.engine), "--model-config", str(args.model_config),
                                   "--weight-dir", str(args.weight_dir), "--device", args.device,
                                   "--max-num-seqs", str(num_seqs), "--max-num-waiting", str(num_seqs),
                                   "--max-num-prefill-tokens", str(num_seqs * args.prompt_len)]))
        profiler = cProfile.Profile() if args.profile else None
        if profiler:
            profiler.enable()
        seconds, steps = asyncio.run(serve_once(llm, num_seqs, args.prompt_len, args.output_len))
        if profiler:
            profiler.disable()
        llm.shutdown()
        print(f"{num_seqs} sequences: {steps:.0f} steps in {seconds:.3f} s, {seconds / steps * 1e3:.2f} ms a step, "
              f"{num_seqs * steps / seconds:,.0f} output tokens/s", flush=True)
        if profiler:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
