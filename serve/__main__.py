"""Serve an engine file behind the OpenAI API.

    python -m serve --engine workspace/engine.py --model-config C --weight-dir W
                    [--tokenizer DIR] [--host 127.0.0.1] [--port 8000] [--device auto] [--replicas N]

On CUDA one replica of the engine serves on each GPU (serve.replicas), behind one endpoint;
--replicas chooses how many (on a CPU, 1 unless asked).

The tokenizer is `--tokenizer`, else the weight folder's own (tokenizer.json beside the
weights), else the repository's toy tokenizer of the model's vocab_size, generated when
missing. Prints `serving http://HOST:PORT` once it answers requests.
"""
import argparse
import asyncio
import json
import logging
from pathlib import Path

import torch
import uvicorn

from contract.checkpoint import check_weight_files
from contract.devices import is_cuda, resolve_device
from contract.model_config import ConfigError, ModelConfig
from serve.app import build_app
from serve.collector import freeze_start_up_objects
from serve.core_client import EngineCoreClient
from serve.llm_engine import LLMEngine
from serve.replicas import ReplicatedClient
from serve.scheduler import SchedulerConfig
from serve.serving import ServedModel
from serve.tokenizer import Tokenizer
from target import toy_tokenizer

log = logging.getLogger("serve")
DEFAULTS = SchedulerConfig()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--weight-dir", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    parser.add_argument("--served-model-name", help="default: the config's model_type")
    parser.add_argument("--max-model-len", type=int, help="default: max_position_embeddings")
    parser.add_argument("--max-num-seqs", type=int, default=DEFAULTS.max_num_seqs)
    parser.add_argument("--max-num-kv-tokens", type=int,
                        help="default: on CUDA what --kv-memory-fraction of the free memory "
                             "holds; on CPU max-num-seqs full contexts")
    parser.add_argument("--kv-memory-fraction", type=float, default=0.5)
    parser.add_argument("--max-num-prefill-tokens", type=int, default=DEFAULTS.max_num_prefill_tokens)
    parser.add_argument("--max-num-waiting", type=int, default=DEFAULTS.max_num_waiting)
    parser.add_argument("--replicas", type=int, help="engine replicas, one per GPU (default: every GPU "
                                                      "on CUDA, 1 on a CPU)")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--timeline", action="store_true",
                        help="record each step's times in both processes, for GET /timeline "
                             "(python -m tools.serve_timeline reads it)")
    return parser.parse_args(argv)


def tokenizer_dir(args) -> Path:
    if args.tokenizer:
        return args.tokenizer
    if (args.weight_dir / "tokenizer.json").exists():
        return args.weight_dir
    return toy_tokenizer.ensure(args.model_config)


def build(args) -> tuple:
    """(the LLMEngine, the ServedModel), the engine core's process started and its engine
    made and warmed up."""
    if not args.engine.is_file():
        raise ConfigError(f"no engine file {args.engine}")
    config = ModelConfig.load(args.model_config)
    check_weight_files(config, args.weight_dir)  # from the headers: a clear message, not the engine core's traceback
    tokenizer = Tokenizer(tokenizer_dir(args))
    if args.replicas is not None and args.replicas < 1:
        raise SystemExit(f"--replicas must be at least 1, got {args.replicas}")
    on_cuda = is_cuda(resolve_device(args.device))
    gpus = max(torch.cuda.device_count(), 1) if on_cuda else 1
    replicas = args.replicas or gpus
    if on_cuda and replicas > gpus:
        raise SystemExit(f"--replicas {replicas}: {torch.cuda.device_count()} GPUs are visible here")
    client = ReplicatedClient(args, tokenizer.eos_token_id, replicas, on_cuda) if replicas > 1 else \
        EngineCoreClient(args, tokenizer.eos_token_id)
    ready = client.wait_ready()
    llm = LLMEngine(client, ready.scheduler_config, tokenizer, args.timeline)
    name = args.served_model_name or json.loads(args.model_config.read_text()).get("model_type", "model")
    max_model_len = args.max_model_len or config.max_position_embeddings
    return llm, ServedModel(name=name, vocab_size=config.vocab_size, max_model_len=max_model_len)


class AnnouncingServer(uvicorn.Server):
    """Says where it serves once it listens (with --port 0, the port it was given)."""

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"serving http://{host}:{port}", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    try:
        llm, model = build(args)
    except ConfigError as err:
        raise SystemExit(f"serve: error: {err}") from None
    config = uvicorn.Config(build_app(llm, model), host=args.host, port=args.port,
                            log_level=args.log_level)
    freeze_start_up_objects()
    try:
        asyncio.run(AnnouncingServer(config).serve())
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
