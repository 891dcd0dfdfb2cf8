"""Load generator: what a user of the server feels, level by level of concurrency.

    python -m serve.bench --base-url http://127.0.0.1:8000 [--concurrency 1,2,4,8,16,32,64]
        [--num-requests 64] [--input-len 1024] [--output-len 1024] [--burst 300] [--warmup 0] [--out DIR]
    python -m serve.bench --base-url ... --workload hackathon   (seed 001's: see HACKATHON)

Each level sends `--num-requests` streamed completions, at most `--concurrency` at a
time, each a prompt of random token ids (drawn now, from a seeded RNG) asking for exactly
`--output-len` tokens (ignore_eos); then `--burst` requests all at once. Per level:
total and output tokens/s (output tokens as the server's usage counts them, and, beside
them, by re-tokenizing the text that came back, as vLLM's benchmark_serving does), time
to first token, time per output token (by both counts), inter-token latency (p50, p99),
failures. The requests go out from several client processes at high concurrency
(--client-processes), so that reading the streams is not what is measured. Writes
DIR/bench.json and DIR/bench.png.

`--workload hackathon` is the GPU-MODE hackathon's throughput run (seed 001): 1,024-token
prompts, fixed 323-token outputs, levels 1-64 of 64 requests each after 2 warm-up requests,
no burst; its score is the weighted *sum* of each level's prompt-plus-completion tokens/s
(the harness's count), beside vLLM 0.19's on 8 H200s.
"""
import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from serve.tokenizer import Tokenizer
from target import toy_tokenizer

HERE = Path(__file__).resolve().parent
# One client process took a core to read ~11k tokens/s of streams (httpx then, a JSON parse
# per chunk; docs/log/2026-11-25-server-host-cost-stand-in-engine.md): at concurrency 64 on a
# GPU the client, not the server, would be measured. Each process sends at most this many
# requests at a time.
REQUESTS_PER_PROCESS = 16
# How much each level of the sweep counts in its one score: high concurrency most.
LEVEL_WEIGHTS = {1: 1, 2: 1, 4: 2, 8: 2, 16: 4, 32: 4, 64: 8}
HACKATHON = {"input_len": 1024, "output_len": 323, "num_requests": 64, "concurrency": list(LEVEL_WEIGHTS),
             "warmup": 2, "burst": 0}
# Seed 001's baseline in the harness's count: vLLM 0.19, 8 H200s, TP 8 (984 tok/s at 1 ... 12,810 at 64).
VLLM_BASELINE_SCORE = 191_151


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    text: str = ""
    latency: float = 0.0  # s, from sending to the last chunk
    ttft: float = 0.0  # s, to the first chunk with text
    chunk_gaps: list = field(default_factory=list)  # s between chunks with text
    usage_prompt_tokens: int = 0
    usage_output_tokens: int = 0
    sent: float = 0.0  # time.perf_counter when sent
    finished: float = 0.0  # and when its last byte came (or it failed)
    events: list = field(default_factory=list)  # (arrival time, raw `data:` event), until read


async def send(http, model: str, prompt: list, output_len: int) -> RequestResult:
    """One streamed completion, its events kept raw with their arrival times (read_events
    makes them figures, once the level is over)."""
    result = RequestResult()
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    result.sent = time.perf_counter()
    try:
        async with http.post("/v1/completions", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {(await response.text())[:200]}")
            result.events = await timed_events(response)
        result.ok = True
    except Exception as error:  # a failure is a result to count, not a reason to stop
        result.error = f"{type(error).__name__}: {error}"
    result.finished = result.events[-1][0] if result.ok and result.events else time.perf_counter()
    return result


async def timed_events(response) -> list:
    """(arrival time, raw payload) of each `data:` event until [DONE]. While a level runs,
    the client only splits what it reads into events and times them: parsing every chunk
    as it came took a client process a core for ~11k tokens/s, and a client that falls
    behind times the server late."""
    events, tail = [], b""
    async for data in response.content.iter_any():
        arrived = time.perf_counter()
        *complete, tail = (tail + data).split(b"\n\n")
        for event in complete:
            line = event.strip()
            if line == b"data: [DONE]":
                return events
            if line.startswith(b"data: "):
                events.append((arrived, line[len(b"data: "):]))
    return events


def read_events(result: RequestResult) -> RequestResult:
    """A request's figures from its raw events: text, time to first token, gaps, usage;
    an error event fails it."""
    last = result.sent
    try:
        for arrived, payload in result.events:
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            last = take_chunk(result, chunk, result.sent, last, arrived)
        result.latency = last - result.sent
    except Exception as error:
        result.ok, result.error = False, f"{type(error).__name__}: {error}"
    result.events = []
    return result


def take_chunk(result: RequestResult, chunk: dict, start: float, last: float, now: float) -> float:
    """Record one chunk's text or usage, which arrived at `now`; the time of the latest chunk
    with text."""
    if chunk.get("usage"):
        result.usage_prompt_tokens = chunk["usage"]["prompt_tokens"]
        result.usage_output_tokens = chunk["usage"]["completion_tokens"]
    text = chunk["choices"][0]["text"] if chunk["choices"] else ""
    if not text:
        return last
    if result.text:
        result.chunk_gaps.append(now - last)
    else:
        result.ttft = now - start
    result.text += text
    return now


async def run_level(http, model, prompts, concurrency: int, output_len: int) -> tuple:
    """(results, start, end) of every prompt sent, at most `concurrency` in flight; start
    and end (the last byte's arrival) on time.perf_counter, which all processes of a host
    share on Linux."""
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt):
        async with gate:
            return await send(http, model, prompt, output_len)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    end = max(r.finished for r in results)  # the last byte's arrival: reading the events is not timed
    return [read_events(r) for r in results], start, end


def client(base_url: str, timeout: float) -> aiohttp.ClientSession:
    """aiohttp, as vLLM's and SGLang's load generators send: at concurrency 1 httpx's own work
    added 1.6 ms to the TTFT that a bare socket reader saw on a 2-core CPU, aiohttp's 0.3-0.6 ms
    (docs/log/2026-11-29-ttft-taken-apart.md). No connection limit: a level's requests must all
    be in flight at once (300 in the burst)."""
    return aiohttp.ClientSession(base_url=base_url, timeout=aiohttp.ClientTimeout(total=timeout),
                                 connector=aiohttp.TCPConnector(limit=0))


def run_share(base_url: str, timeout: float, model: str, prompts: list, concurrency: int,
              output_len: int) -> tuple:
    """A client process's share of a level: run_level on its own event loop."""
    async def share():
        async with client(base_url, timeout) as http:
            return await run_level(http, model, prompts, concurrency, output_len)
    return asyncio.run(share())


def num_processes(concurrency: int, requested: int) -> int:
    """Client processes for a level: `requested`, else one per REQUESTS_PER_PROCESS in
    flight, at most a quarter of the host's cores (the server needs the rest)."""
    if requested:
        return max(1, min(requested, concurrency))
    return max(1, min(math.ceil(concurrency / REQUESTS_PER_PROCESS), (os.cpu_count() or 1) // 4))


async def run_level_in(pool, args, model: str, prompts: list, concurrency: int) -> tuple:
    """(results in the order of `prompts`, seconds): the level split over the pool's
    processes (round robin), each with its share of the concurrency."""
    n = num_processes(concurrency, args.client_processes)
    loop = asyncio.get_running_loop()
    shares = await asyncio.gather(*(
        loop.run_in_executor(pool, run_share, args.base_url, args.timeout, model, prompts[i::n],
                             concurrency // n + (i < concurrency % n), args.output_len)
        for i in range(n)))
    results = [None] * len(prompts)
    for i, (share, _, _) in enumerate(shares):
        results[i::n] = share
    return results, max(end for _, _, end in shares) - min(start for _, start, _ in shares)


def percentiles(values: list, scale: float = 1e3) -> dict:
    """p50 and p99 in ms (of values in s); None when there is nothing to measure."""
    if not values:
        return {"p50": None, "p99": None}
    p50, p99 = np.percentile(values, [50, 99]) * scale
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3)}


def summarize(results: list, seconds: float, concurrency: int, tokenizer: Tokenizer) -> dict:
    """A level's figures. Output tokens are the server's count (usage), which is the
    engine's: the same unit as the engine offline (tools.serve_offline). The re-tokenized
    count vLLM's benchmark_serving uses is beside it: re-tokenized random tokens merge or
    split (on the toy tokenizer 72,389 for 65,536 generated,
    docs/log/2026-11-25-public-show-twelve-layer-serve-sweep.md)."""
    done = [r for r in results if r.ok]
    output_tokens = sum(r.usage_output_tokens for r in done)
    retokenized = [len(tokenizer.encode(r.text, add_special_tokens=False)) for r in done]
    prompt_tokens = sum(r.usage_prompt_tokens for r in done)
    return {
        "concurrency": concurrency, "requests": len(results), "completed": len(done),
        "failed": len(results) - len(done), "errors": sorted({r.error for r in results if not r.ok})[:5],
        "seconds": round(seconds, 3),
        "output_tokens": output_tokens, "prompt_tokens": prompt_tokens,
        "output_tokens_per_s": round(output_tokens / seconds, 2),
        "total_tokens_per_s": round((prompt_tokens + output_tokens) / seconds, 2),
        "ttft_ms": percentiles([r.ttft for r in done]),
        "tpot_ms": percentiles(time_per_token(done, [r.usage_output_tokens for r in done])),
        "itl_ms": percentiles([gap for r in done for gap in r.chunk_gaps]),
        "retokenized_output_tokens": sum(retokenized),
        "retokenized_output_tokens_per_s": round(sum(retokenized) / seconds, 2),
        "retokenized_tpot_ms": percentiles(time_per_token(done, retokenized)),
    }


def time_per_token(done: list, counts: list) -> list:
    """Each request's time from its first token to its last, over the tokens after the first."""
    return [(r.latency - r.ttft) / (n - 1) for r, n in zip(done, counts) if n > 1]


def random_prompts(tokenizer: Tokenizer, count: int, length: int, rng: random.Random) -> list:
    special = set(tokenizer.backend.get_added_tokens_decoder())
    ordinary = [t for t in range(tokenizer.vocab_size) if t not in special]
    return [rng.choices(ordinary, k=length) for _ in range(count)]


def whole_sweep(levels: list) -> bool:
    """Each of the hackathon's levels once: a score of some of them would not be its score."""
    return sorted(lv["concurrency"] for lv in levels) == sorted(LEVEL_WEIGHTS)


def weighted_score(levels: list) -> float:
    """Output tokens/s over the sweep's levels, weighted by LEVEL_WEIGHTS."""
    if not whole_sweep(levels):
        return None
    scored = [(LEVEL_WEIGHTS[lv["concurrency"]], lv["output_tokens_per_s"]) for lv in levels
              if lv["concurrency"] in LEVEL_WEIGHTS]
    total = sum(w for w, _ in scored)
    return round(sum(w * tps for w, tps in scored) / total, 2) if total else None


def harness_score(levels: list) -> float:
    """The hackathon's score: each level's prompt-plus-completion tokens/s times its weight, summed."""
    if not whole_sweep(levels):
        return None
    return round(sum(LEVEL_WEIGHTS[lv["concurrency"]] * lv["total_tokens_per_s"] for lv in levels
                     if lv["concurrency"] in LEVEL_WEIGHTS), 2)


async def bench(args, tokenizer: Tokenizer) -> dict:
    async with client(args.base_url, args.timeout) as http, http.get("/v1/models") as models:
        model = args.model or (await models.json())["data"][0]["id"]
    levels = args.concurrency + ([args.burst] if args.burst else [])
    with client_pool(max(num_processes(c, args.client_processes) for c in levels)) as pool:
        rng = random.Random(args.seed)
        report = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                  "model": model, "sweep": []}
        for concurrency in args.concurrency:
            if args.warmup:  # sent and discarded, as the hackathon's harness does before each level
                await run_level_in(pool, args, model, random_prompts(tokenizer, args.warmup, args.input_len, rng),
                                   min(concurrency, args.warmup))
            prompts = random_prompts(tokenizer, args.num_requests, args.input_len, rng)
            report["sweep"].append(await measure(pool, args, model, prompts, concurrency, tokenizer))
        report["weighted_output_tokens_per_s"] = weighted_score(report["sweep"])
        report["harness_score"] = harness_score(report["sweep"])
        report["vllm_baseline_score"] = VLLM_BASELINE_SCORE
        if args.burst:
            prompts = random_prompts(tokenizer, args.burst, args.input_len, rng)
            report["burst"] = await measure(pool, args, model, prompts, args.burst, tokenizer)
    return report


@contextmanager
def client_pool(size: int):
    """`size` client processes, started before any level is timed."""
    with ProcessPoolExecutor(size, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(time.sleep, [0.5] * size))  # each process up and imported
        yield pool


async def measure(pool, args, model, prompts, concurrency, tokenizer) -> dict:
    results, seconds = await run_level_in(pool, args, model, prompts, concurrency)
    level = summarize(results, seconds, concurrency, tokenizer)
    print(json.dumps(level), flush=True)
    return level


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["sweep"]
    x = [lv["concurrency"] for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(x, [lv["output_tokens_per_s"] for lv in levels], "o-", label="output")
    axes[0].plot(x, [lv["total_tokens_per_s"] for lv in levels], "s--", label="total")
    axes[0].set(title="tokens/s", ylabel="tokens/s")
    for ax, key in ((axes[1], "ttft_ms"), (axes[2], "tpot_ms")):
        for p in ("p50", "p99"):
            ax.plot(x, [lv[key][p] for lv in levels], "o-", label=p)
        ax.set(title=key.replace("_ms", "").upper(), ylabel="ms")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(c) for c in x])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", help="default: the first the server lists")
    parser.add_argument("--tokenizer", type=Path,
                        help="the model's tokenizer folder (default: the toy tokenizer of --model-config)")
    parser.add_argument("--model-config", type=Path, default=HERE.parent / "target" / "model_config.json")
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                        default=list(LEVEL_WEIGHTS))
    parser.add_argument("--num-requests", type=int, default=64, help="per level")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--burst", type=int, default=300, help="requests sent at once after the sweep; 0: none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="s, per request")
    parser.add_argument("--client-processes", type=int, default=0,
                        help=f"processes sending a level's requests (default: one per {REQUESTS_PER_PROCESS} "
                             "in flight, at most a quarter of the cores)")
    parser.add_argument("--warmup", type=int, default=0, help="requests sent and discarded before each level")
    parser.add_argument("--workload", choices=("custom", "hackathon"), default="custom",
                        help="hackathon: seed 001's levels, lengths and warm-up as defaults (HACKATHON)")
    parser.add_argument("--out", type=Path, default=Path("serve_bench"))
    if parser.parse_known_args(argv)[0].workload == "hackathon":
        parser.set_defaults(**HACKATHON)  # what the command line gives still stands
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    tokenizer = Tokenizer(args.tokenizer or toy_tokenizer.ensure(args.model_config))
    report = asyncio.run(bench(args, tokenizer))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "bench.png")
    if report["harness_score"] is not None:
        print(f"harness score {report['harness_score']:,.0f} (vLLM 0.19 on 8 H200s: {VLLM_BASELINE_SCORE:,})")
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")


if __name__ == "__main__":
    main()
