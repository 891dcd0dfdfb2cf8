"""`transformers` itself on a Hugging Face checkpoint, on the large cases our engines are
benched on (fitness.cases.large_cases: one request decoding, 64 decoding, a 16 x 1024
prefill), so that our engines' figures have the library's own beside them
(docs/log/2026-11-25-serve-launched-ahead-seed-only-one-b-bf16.md).

    python -m tools.transformers_bench DIR [--mode eager|compiled] [--repeat 3] [--device cuda]
        [--case NAME ...] [--steps N]

`eager`: from_pretrained as it comes (SDPA attention, a dynamic cache). `compiled`: what
transformers' "Optimizing inference" page advises, a static cache, with which `generate`
compiles its decoding forward itself (CompileConfig: torch.compile "reduce-overhead", CUDA
graphs); the prefill case calls a forward under torch.compile without graphs. First calls
compile, and are the warm-up. A decode case runs generate(P + S + 1) and times its S
decode steps apart from the prefill: a streamer notes the clock as each step's tokens reach
the host (generate copies them there, waiting for the device, every step), and the steps
are the span from the prefill's token to the last, as `fitness bench --step-time` times
ours. (generate(P + S + 1) less generate(P + 1), as this took it before, let both runs'
prefill noise into the step: docs/log/2026-11-28-transformers-steps-apart-llama-64-row.md.) Prints
one JSON line per
case, with peak memory; compare with python -m fitness bench --cases large --roofline on
the same card.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

DECODE_CASES = {"decode_1x128x64": (1, 128, 64), "decode_64x256x64": (64, 256, 64)}  # batch, prompt, steps
PREFILL_CASES = {"prefill_16x1024": (16, 1024)}  # batch, prompt


def load(folder, mode: str, device: str):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device).eval()
    if mode == "compiled":
        # generate compiles its own step; wrapping model.forward in "reduce-overhead" as well
        # made it read logits that the next graph replay had overwritten (an H200, 5.x).
        model.generation_config.cache_implementation = "static"
        model.compiled_forward = torch.compile(model.forward)
    return model


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeat: int, device: str) -> float:
    """The median seconds of `repeat` calls, after one warm-up call."""
    fn()
    seconds = []
    for _ in range(repeat):
        synchronize(device)
        started = time.perf_counter()
        fn()
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


class StepClock(BaseStreamer):
    """generate's streamer: the clock each time tokens reach the host. The first call
    brings the prompt, the second the prefill's token, each later one a decode step's."""

    def __init__(self):
        self.times = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def step_seconds(self) -> list:
        return [after - before for before, after in zip(self.times[1:], self.times[2:])]


def decode_case(model, batch: int, prompt: int, steps: int, repeat: int, device: str) -> dict:
    tokens = torch.randint(0, model.config.vocab_size, (batch, prompt), device=device)

    def run() -> list:
        clock = StepClock()
        model.generate(tokens, attention_mask=torch.ones_like(tokens), do_sample=False, streamer=clock,
                       max_new_tokens=steps + 1, min_new_tokens=steps + 1)
        assert len(clock.times) == steps + 2, f"{len(clock.times)} streamer calls for {steps + 1} new tokens"
        return clock.step_seconds()

    run()  # warm-up (and, compiled, the compilation)
    runs = [run() for _ in range(repeat)]
    run_ms = [1000 * sum(run_steps) / steps for run_steps in runs]
    every_step_ms = sorted(1000 * step for run_steps in runs for step in run_steps)
    ms = statistics.median(run_ms)
    return {"ms_per_step": ms, "decode_tokens_per_second": 1000 * batch / ms,
            "run_ms_per_step": [round(run, 3) for run in run_ms],
            "step_ms_10_50_90": [round(every_step_ms[int(q * (len(every_step_ms) - 1))], 3) for q in (0.1, 0.5, 0.9)]}


def prefill_case(model, batch: int, prompt: int, repeat: int, device: str) -> dict:
    tokens = torch.randint(0, model.config.vocab_size, (batch, prompt), device=device)
    # Last-token logits only, as an engine returns them (all 16 x 1024 rows would be 4 GB).
    forward = getattr(model, "compiled_forward", model)
    seconds = timed(lambda: forward(tokens, logits_to_keep=1, use_cache=False), repeat, device)
    return {"ms": 1000 * seconds, "tokens_per_second": batch * prompt / seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--case", action="append", choices=(*DECODE_CASES, *PREFILL_CASES),
                        help="only this case (repeatable; default: every case)")
    parser.add_argument("--steps", type=int, help="decode steps a decode case times (default: its own, 64)")
    args = parser.parse_args(argv)
    model = load(args.folder, args.mode, args.device)
    decodes = {name: (batch, prompt, args.steps or steps) for name, (batch, prompt, steps) in DECODE_CASES.items()}
    cases = {**{name: (decode_case, shape) for name, shape in decodes.items()},
             **{name: (prefill_case, shape) for name, shape in PREFILL_CASES.items()}}
    with torch.no_grad():
        for name, (measure, shape) in cases.items():
            if args.case and name not in args.case:
                continue
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            result = measure(model, *shape, args.repeat, args.device)
            peak = torch.cuda.max_memory_allocated() / 2 ** 20 if args.device == "cuda" else None
            print(json.dumps({"case": name, "mode": args.mode, **result, "peak_memory_mb": peak}))


if __name__ == "__main__":
    main()
