"""The engine without the server, on serve.bench's work: what the server is measured against.

    python -m tools.serve_offline --engine E --model-config C --weight-dir W [--device cuda]
        [--num-requests 64] [--input-len 1024] [--output-len 1024] [--repeats 5]

Prints one JSON object:
  batch_output_tokens_per_s  all requests prefilled (in the server's prefill chunks), then
                             decoded together greedily, each step's tokens fed back on the
                             device with no host sync: the most a server can give them
  prefill_ms                 one prompt of --input-len prefilled alone (median of repeats)
  decode_step_ms             one decode step of one request (median over its output)
The server is held to: output tokens/s at concurrency 64 at least 85% of the first, TTFT
at concurrency 1 within 5 ms of the second, TPOT within 10% of the third.
"""
import argparse
import json
import statistics
import time

import torch

from fitness.bench import synchronize
from serve.model_runner import load_engine
from serve.scheduler import SchedulerConfig



def random_prompts(count, length, vocab_size, device, seed=0) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=generator).to(device) for _ in range(count)]


@torch.inference_mode()
def batch_throughput(engine, prompts, output_len, device, prefill_chunk_tokens) -> float:
    """Output tokens/s of every prompt prefilled, then decoded together for output_len tokens."""
    ids = list(range(len(prompts)))
    per_chunk = max(1, prefill_chunk_tokens // len(prompts[0]))
    synchronize(device)
    start = time.perf_counter()
    tokens = torch.cat([engine.prefill(ids[i:i + per_chunk], prompts[i:i + per_chunk]).argmax(-1)
                        for i in range(0, len(ids), per_chunk)])
    for _ in range(output_len - 1):
        tokens = engine.decode(ids, tokens).argmax(-1)
    synchronize(device)
    seconds = time.perf_counter() - start
    engine.remove(ids)
    return len(prompts) * output_len / seconds


@torch.inference_mode()
def single_request_ms(engine, prompt, output_len, device, repeats) -> tuple:
    """(median prefill ms, median decode step ms) of one request alone."""
    prefills, steps = [], []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        token = engine.prefill([0], [prompt]).argmax(-1)
        synchronize(device)
        prefills.append(time.perf_counter() - start)
        for _ in range(output_len - 1):
            start = time.perf_counter()
            token = engine.decode([0], token).argmax(-1)
            synchronize(device)
            steps.append(time.perf_counter() - start)
        engine.remove([0])
    return 1e3 * statistics.median(prefills), 1e3 * statistics.median(steps)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--model-config", required=True)
    parser.add_argument("--weight-dir", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5, help="of the single request")
    parser.add_argument("--prefill-chunk-tokens", type=int, default=SchedulerConfig().max_num_prefill_tokens)
    args = parser.parse_args(argv)
    vocab_size = json.load(open(args.model_config))["vocab_size"]
    engine = load_engine(args.engine, args.model_config, args.weight_dir, args.device)
    prompts = random_prompts(args.num_requests, args.input_len, vocab_size, args.device)
    batch_throughput(engine, prompts[:2], 2, args.device, args.prefill_chunk_tokens)  # warm-up
    result = {"batch_output_tokens_per_s": batch_throughput(
        engine, prompts, args.output_len, args.device, args.prefill_chunk_tokens)}
    result["prefill_ms"], result["decode_step_ms"] = single_request_ms(
        engine, prompts[0], min(args.output_len, 128), args.device, args.repeats)
    print(json.dumps({**vars(args), **{k: round(v, 3) for k, v in result.items()}}))


if __name__ == "__main__":
    main()
