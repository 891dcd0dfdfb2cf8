"""N requests at once through the real HTTP server, and where each engine step's time went.

    python -m tools.serve_timeline [--engine tools/probes/fixed_step_engine.py] [--concurrency 64 300]
        [--input-len 128] [--output-len 256] [--device cpu] [--rows 16] [--base-url URL]
        [--clients raw bench] [--one-by-one N]

Starts `python -m serve --timeline` on a free port (or uses --base-url's), sends each level's
N streamed completions at once, and prints per level: output tokens/s against the same engine
offline (tools.serve_offline, in the same call, at a batch of N or of --max-num-seqs, the
most the server runs together), TTFT and TPOT, and from the
server's step timeline (GET /timeline) a table of --rows steps spread over the level and the
medians: a step's wall time, the core's host time, its wait for the device, the API side's
time, and whether the API side had handed a step out before the core sent the next one
(it ran beside the next step); then the level's ramp: over how long its requests were
submitted, and its first --ramp-rows steps. `--one-by-one N` then sends N requests one
after another and prints where their TTFT went (ttft_parts). With the fixed-step engine
(STEP_MS, default 2.7 here, an H100's step at 64 requests) the step itself is asleep, so
what is left is the server's own; its calls return done, so a core's first token waits a
step more than on a GPU.

The client is a bare asyncio HTTP/1.1 reader that counts bytes and parses only the usage at
the end, so that on a small machine it is not the client that is measured; `--clients raw
bench` sends each level twice, the second time by serve.bench's client processes, to tell
the server's figures from the load generator's. The server and the offline run get
OMP_NUM_THREADS=1 unless it is set.
"""
import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tools.arguments import target_arguments

HERE = Path(__file__).resolve().parent
STARTUP_SECONDS = 600
COLUMNS = ("step", "seqs", "waiting", "wall_ms", "core_host_ms", "device_wait_ms", "api_ms", "lag_ms", "gc_ms",
           "overlapped")
RAMP_COLUMNS = ("step", "sent_ms", "seqs", "waiting", "wall_ms", "device_wait_ms", "gc_ms")


@dataclass
class Answer:
    ttft: float = 0.0  # s, to the first event
    last: float = 0.0  # s, to the last byte
    sent: float = 0.0  # time.perf_counter when the request was written (its connection open)
    first_event: float = 0.0  # and when its first event came
    output_tokens: int = 0
    error: str = ""


async def stream_completion(host: str, port: int, body: bytes) -> Answer:
    """One streamed completion over its own connection: when events came, and its usage."""
    answer = Answer()
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        answer.sent = time.perf_counter()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (host.encode(), len(body), body))
        tail = b""
        while chunk := await reader.read(1 << 16):
            answer.last = time.perf_counter() - start
            if not answer.ttft and b"data: " in chunk:
                answer.ttft, answer.first_event = answer.last, start + answer.last
            tail = (tail + chunk)[-4096:]
        writer.close()
        usage = tail[tail.rindex(b'"usage":') + 8:]
        answer.output_tokens = json.JSONDecoder().raw_decode(usage.decode())[0]["completion_tokens"]
    except Exception as error:  # a failure is a result to count, not a reason to stop
        answer.error = f"{type(error).__name__}: {error}"
    return answer


async def send_at_once(base_url: str, model: str, prompts: list, output_len: int) -> tuple:
    """(answers, seconds) of every prompt sent at once."""
    url = urlsplit(base_url)
    bodies = [json.dumps({"model": model, "prompt": p, "max_tokens": output_len, "temperature": 0.0,
                          "stream": True, "stream_options": {"include_usage": True},
                          "ignore_eos": True}).encode() for p in prompts]
    start = time.perf_counter()
    answers = await asyncio.gather(*(stream_completion(url.hostname, url.port, b) for b in bodies))
    return answers, time.perf_counter() - start


async def send_by_bench(base_url: str, model: str, prompts: list, output_len: int) -> tuple:
    """(answers, seconds) of every prompt sent at once by serve.bench's client processes."""
    from serve import bench
    settings = argparse.Namespace(base_url=base_url, timeout=3600.0, client_processes=0, output_len=output_len)
    with bench.client_pool(bench.num_processes(len(prompts), 0)) as pool:
        results, seconds = await bench.run_level_in(pool, settings, model, prompts, len(prompts))
    return [Answer(ttft=r.ttft, last=r.latency, output_tokens=r.usage_output_tokens, error=r.error)
            for r in results], seconds


SEND = {"raw": send_at_once, "bench": send_by_bench}


def level_figures(answers: list, seconds: float) -> dict:
    done = [a for a in answers if not a.error]
    tokens = sum(a.output_tokens for a in done)
    tpot = [(a.last - a.ttft) / (a.output_tokens - 1) for a in done if a.output_tokens > 1]
    median = lambda xs: round(1e3 * statistics.median(xs), 2) if xs else None  # noqa: E731
    return {"requests": len(answers), "completed": len(done), "errors": sorted({a.error for a in answers if a.error})[:3],
            "seconds": round(seconds, 3), "output_tokens_per_s": round(tokens / seconds, 1),
            "ttft_p50_ms": median([a.ttft for a in done]), "tpot_p50_ms": median(tpot)}


def step_rows(timeline: list) -> list:
    """A row of COLUMNS per step that read tokens back, from the server's raw timeline
    (the core's schedule, launched, device_done, sent; the API's received, detokenized,
    handed; the step's number of sequences, and of those still waiting; the collector's
    pauses in the core and in the API process)."""
    rows = []
    for this, after in zip(timeline, timeline[1:]):
        schedule, launched, done, sent, received, detokenized, handed, seqs, waiting, core_gc, api_gc = this
        rows.append({"step": len(rows), "seqs": seqs, "waiting": waiting, "sent": sent,
                     "wall_ms": after[0] - schedule, "core_host_ms": (launched - schedule) + (sent - done),
                     "device_wait_ms": done - launched, "api_ms": handed - received,
                     "lag_ms": received - sent, "gc_ms": core_gc + api_gc, "overlapped": handed <= after[3]})
    for row in rows:
        for key in ("wall_ms", "core_host_ms", "device_wait_ms", "api_ms", "lag_ms", "gc_ms"):
            row[key] = round(row[key] * 1e3, 3)
    return rows


def print_table(rows: list, num_rows: int) -> None:
    busy = [r for r in rows if r["seqs"]]
    if not busy:
        print("  (no timeline: the server was not started with --timeline)")
        return
    picked = busy[::max(1, len(busy) // num_rows)][:num_rows] if num_rows else busy
    print("  " + "  ".join(f"{c:>14}" for c in COLUMNS))
    for row in picked:
        print("  " + "  ".join(f"{str(row[c]):>14}" for c in COLUMNS))
    medians = {c: round(statistics.median(r[c] for r in busy), 3) for c in COLUMNS[1:-1]}
    overlapped = sum(r["overlapped"] for r in busy) / len(busy)
    print(f"  median of {len(busy)} steps: " + ", ".join(f"{k} {v}" for k, v in medians.items())
          + f"; API side done before the next step was sent in {overlapped:.0%}")


def print_ramp(rows: list, submitted: list, arrived: list, num_rows: int) -> None:
    """How the level started: when its requests reached the server (submitted, after their
    HTTP parse) and its engine core, and its first steps, in ms since the first was
    submitted."""
    if not (rows and submitted):
        return
    first = submitted[0]
    reached = (f"; they reached the core from {1e3 * (arrived[0] - first):.1f} to {1e3 * (arrived[-1] - first):.1f} ms"
               if arrived else "")
    print(f"  ramp: {len(submitted)} requests submitted over {1e3 * (submitted[-1] - first):.1f} ms{reached}; "
          f"the level's last tokens sent at {1e3 * (rows[-1]['sent'] - first):.1f} ms; "
          f"the first {num_rows} steps (sent_ms: the step's tokens sent, since the first submission):")
    print("  " + "  ".join(f"{c:>14}" for c in RAMP_COLUMNS))
    for row in rows[:num_rows]:
        shown = {**row, "sent_ms": round(1e3 * (row["sent"] - first), 1)}
        print("  " + "  ".join(f"{str(shown[c]):>14}" for c in RAMP_COLUMNS))


def recorded_since(base_url: str) -> dict:
    """What the server recorded since it was last asked ({"steps", "submitted", "arrived"});
    nothing from a server without --timeline."""
    return get(base_url, "/timeline") or {"steps": [], "submitted": [], "arrived": []}


def split_levels(recorded: dict, gap_s: float = 0.25) -> list:
    """What a server recorded over several levels (`--recorded`), one {"steps", "submitted",
    "arrived"} a level: a level ends where the core went idle for more than `gap_s`."""
    levels = []
    for step in recorded["steps"]:
        if not levels or step[0] - levels[-1]["steps"][-1][3] > gap_s:
            levels.append({"steps": []})
        levels[-1]["steps"].append(step)
    # A level's requests were submitted (and reached the core) after the level before it ended.
    bounds = [float("-inf")] + [level["steps"][-1][3] for level in levels[:-1]] + [float("inf")]
    for level, low, high in zip(levels, bounds, bounds[1:]):
        for key in ("submitted", "arrived"):
            level[key] = [t for t in recorded[key] if low <= t < high]
    return levels


def ttft_parts(answers: list, recorded: dict) -> dict:
    """Where each TTFT of requests sent one after another went, in ms (medians): the client's
    write to the handler's submission (HTTP, parse, checks), to the core, the core's prefill
    until its first token was sent (that step's launch and device time), the API side's
    hand-out, and the way back to the client."""
    first_token_steps = [s for s in recorded["steps"] if s[7]]  # steps that read tokens back
    parts = {key: [] for key in ("to_submitted", "to_core", "core_to_first_sent", "sent_to_handed",
                                 "handed_to_client", "ttft")}
    for answer, submitted, arrived in zip(answers, recorded["submitted"], recorded["arrived"]):
        step = next((s for s in first_token_steps if s[3] > arrived), None)
        if answer.error or step is None:
            continue
        sent, handed, first_event = step[3], step[6], answer.first_event
        for key, value in (("to_submitted", submitted - answer.sent), ("to_core", arrived - submitted),
                           ("core_to_first_sent", sent - arrived), ("sent_to_handed", handed - sent),
                           ("handed_to_client", first_event - handed), ("ttft", first_event - answer.sent)):
            parts[key].append(value)
    return {key: round(1e3 * statistics.median(values), 3) for key, values in parts.items() if values}


async def one_by_one(base_url: str, model: str, prompts: list, output_len: int) -> list:
    """Answers to `prompts` sent one after another by the raw client."""
    return [(await send_at_once(base_url, model, [prompt], output_len))[0][0] for prompt in prompts]


def print_level(recorded: dict, args) -> None:
    rows = step_rows(recorded["steps"])
    print_table(rows, args.rows)
    print_ramp(rows, recorded["submitted"], recorded["arrived"], args.ramp_rows)


def offline(args, batch: int) -> dict:
    """tools.serve_offline on a batch of `batch`, in a process of its own (its memory is freed)."""
    command = [sys.executable, "-m", "tools.serve_offline", "--engine", str(args.engine),
               "--model-config", str(args.model_config), "--weight-dir", str(args.weight_dir),
               "--device", args.device, "--num-requests", str(batch), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len), "--repeats", "1"]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def start_server(args, log_path: Path) -> tuple:
    """(process, URL) of `python -m serve --timeline` on a free port."""
    command = [sys.executable, "-m", "serve", "--engine", str(args.engine), "--model-config", str(args.model_config),
               "--weight-dir", str(args.weight_dir), "--device", args.device, "--port", "0", "--timeline",
               "--max-num-seqs", str(args.max_num_seqs), *args.server_flags]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        line = process.stdout.readline()
        if line.startswith("serving "):
            return process, line.split()[1]
    process.kill()
    raise RuntimeError(f"the server did not start: {log_path.read_text()[-2000:]}")


def get(base_url: str, path: str):
    import httpx
    response = httpx.get(base_url + path, timeout=60)
    return response.json() if response.status_code == 200 else None


def run_levels(args, base_url: str) -> None:
    model = get(base_url, "/v1/models")["data"][0]["id"]
    rng = random.Random(0)
    offline_rates = {}  # batch: output tokens/s
    vocab_size = json.loads(args.model_config.read_text())["vocab_size"]
    for concurrency in args.concurrency:
        prompts = [[rng.randrange(3, vocab_size) for _ in range(args.input_len)] for _ in range(concurrency)]
        for client in args.clients:
            get(base_url, "/timeline")  # what earlier levels left
            answers, seconds = asyncio.run(SEND[client](base_url, model, prompts, args.output_len))
            level = {"concurrency": concurrency, "client": client, **level_figures(answers, seconds)}
            if not args.no_offline:
                batch = min(concurrency, args.max_num_seqs)
                if batch not in offline_rates:
                    offline_rates[batch] = round(offline(args, batch)["batch_output_tokens_per_s"], 1)
                level["offline_output_tokens_per_s"] = offline_rates[batch]
                level["served_over_offline"] = round(level["output_tokens_per_s"] / level["offline_output_tokens_per_s"], 3)
            print(json.dumps(level), flush=True)
            print_level(recorded_since(base_url), args)
    if args.one_by_one:
        prompts = [[rng.randrange(3, vocab_size) for _ in range(args.input_len)] for _ in range(args.one_by_one)]
        get(base_url, "/timeline")
        answers = asyncio.run(one_by_one(base_url, model, prompts, args.output_len))
        parts = {"one_by_one": len(answers), "errors": sum(bool(a.error) for a in answers),
                 **ttft_parts(answers, recorded_since(base_url))}
        if not args.no_offline and "ttft" in parts:
            parts["offline_prefill_ms"] = round(offline(args, 1)["prefill_ms"], 3)
            parts["ttft_minus_prefill_ms"] = round(parts["ttft"] - parts["offline_prefill_ms"], 3)
        print(json.dumps(parts), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.serve_timeline", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=HERE / "probes" / "fixed_step_engine.py")
    target_arguments(parser, device="cpu")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 300])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=64,
                        help="the server's (default: its own default, as tools/gpu/serve.sh serves)")
    parser.add_argument("--rows", type=int, default=16, help="steps printed per level (0: all)")
    parser.add_argument("--ramp-rows", type=int, default=12, help="the level's first steps printed")
    parser.add_argument("--clients", nargs="+", choices=tuple(SEND), default=["raw"],
                        help="who sends each level, in turn: raw (a bare asyncio reader, one connection "
                             "a request) or bench (serve.bench's client processes, as it measures)")
    parser.add_argument("--one-by-one", type=int, default=0, metavar="N",
                        help="then N requests one after another (raw client), and where their TTFT went: "
                             "to the handler's submission, to the core, the core's first token, its hand-out, "
                             "back to the client (medians, ms; needs the server's --timeline)")
    parser.add_argument("--base-url", help="a server already running (its own flags); default: start one")
    parser.add_argument("--no-offline", action="store_true", help="skip the offline yardstick")
    parser.add_argument("--recorded", action="store_true",
                        help="send nothing: print what --base-url's server recorded since it was last "
                             "asked (another load generator's levels, e.g. serve.bench's), level by level")
    parser.add_argument("--server-flags", nargs=argparse.REMAINDER, default=[],
                        help="the rest goes to python -m serve")
    args = parser.parse_args(argv)
    os.environ.setdefault("STEP_MS", "2.7")  # for the servers and offline runs started here
    # On a small CPU the fixed-step engine's logits and argmax stand for device work: a second
    # intra-op thread would only fight the API process and the client for the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.recorded:
        for number, level in enumerate(split_levels(recorded_since(args.base_url)), 1):
            print(f"level {number}: {len(level['steps'])} steps")
            print_level(level, args)
        return 0
    if args.base_url:
        run_levels(args, args.base_url)
        return 0
    log_path = Path(os.environ.get("SERVE_LOG", "/tmp/serve_timeline_server.log"))
    process, url = start_server(args, log_path)
    try:
        run_levels(args, url)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
