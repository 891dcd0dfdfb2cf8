"""`transformers` itself on a Hugging Face checkpoint, on the large cases our engines are
benched on (fitness.cases.large_cases: one request decoding, 64 decoding, a 16 x 1024
prefill), so that our engines' figures have the library's own beside them (docs/PERF.md).

    python -m tools.transformers_bench DIR [--mode eager|compiled] [--repeat 3] [--device cuda]

`eager`: from_pretrained as it comes (SDPA attention, a dynamic cache). `compiled`: what
transformers' "Optimizing inference" page advises, a static cache, with which `generate`
compiles its decoding forward itself (CompileConfig: torch.compile "reduce-overhead", CUDA
graphs); the prefill case calls a forward under torch.compile without graphs. First calls
compile, and are the warm-up. A decode case's time is generate(P + S + 1) less
generate(P + 1): the S decode steps alone, the prefill's time taken out. Prints one JSON
line per case, with peak memory; compare with python -m fitness bench --cases large
--roofline on the same card.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

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


def timed(fn, repeat: int, device: str) -> float:
    """The median seconds of `repeat` calls, after one warm-up call."""
    fn()
    seconds = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def decode_case(model, batch: int, prompt: int, steps: int, repeat: int, device: str) -> dict:
    tokens = torch.randint(0, model.config.vocab_size, (batch, prompt), device=device)

    def generate(new_tokens):
        return lambda: model.generate(tokens, attention_mask=torch.ones_like(tokens), do_sample=False,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens)

    seconds = timed(generate(steps + 1), repeat, device) - timed(generate(1), repeat, device)
    return {"ms_per_step": 1000 * seconds / steps, "decode_tokens_per_second": batch * steps / seconds}


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
    args = parser.parse_args(argv)
    model = load(args.folder, args.mode, args.device)
    cases = {**{name: (decode_case, shape) for name, shape in DECODE_CASES.items()},
             **{name: (prefill_case, shape) for name, shape in PREFILL_CASES.items()}}
    with torch.no_grad():
        for name, (measure, shape) in cases.items():
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            result = measure(model, *shape, args.repeat, args.device)
            peak = torch.cuda.max_memory_allocated() / 2 ** 20 if args.device == "cuda" else None
            print(json.dumps({"case": name, "mode": args.mode, **result, "peak_memory_mb": peak}))


if __name__ == "__main__":
    main()
