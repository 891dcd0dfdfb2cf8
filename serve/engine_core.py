"""The engine core, in a process of its own: requests in, one step after another, each
step's tokens out (vLLM V1's EngineCore).

Between two steps only what the next one needs runs here: the requests and aborts that
came, the scheduler's next batch, its launch, the read-back of the step before it, and one
message to the API process carrying every sequence's new token (its log-probabilities, and
whether EOS or max_tokens ended it there). Text, stop strings, streaming and HTTP are the
API process's (serve.output_processor, serve.app): they run beside the next step, on other
cores, with a GIL of their own.

With --timeline each message also carries when the step was scheduled, launched, read back
(the device done) and sent, perf_counter times that the API process's share on Linux.
"""
import logging
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Optional

import torch

from contract.devices import is_cuda, resolve_device
from contract.model_config import ModelConfig
from serve.collector import GcPauses, freeze_start_up_objects
from serve.model_runner import LaunchedStep, ModelRunner, load_engine
from serve.scheduler import Scheduler, SchedulerConfig
from serve.sequence import Sequence

log = logging.getLogger("serve")


@dataclass
class StepOutputs:
    """One step's tokens, all its sequences' in one message."""
    seq_ids: list
    token_ids: list
    finished: dict  # seq_id: "stop" (EOS) or "length" (max_tokens), of those that ended here
    logprobs: dict  # seq_id: TokenLogprobs, of those that asked
    num_running: int
    num_waiting: int
    num_generated_tokens: int  # since start, cancelled sequences' included
    # With --timeline: schedule, launched, device done, sent; the collector's pause since the
    # step before; when the requests added since the step before reached the core.
    times: Optional[tuple] = None
    gc_seconds: float = 0.0
    arrived: tuple = ()


@dataclass
class CoreReady:
    """The engine is made and warmed up; admission's limits as the core measured them."""
    scheduler_config: SchedulerConfig


@dataclass
class CoreFailed:
    """What stopped the core (its state is unknown now: every request fails)."""
    message: str


class EngineCore:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, eos_token_id: Optional[int],
                 record_timeline: bool = False):
        self.runner = runner
        self.scheduler = scheduler
        self.eos_token_id = eos_token_id
        self.record_timeline = record_timeline
        self.seqs = {}  # seq_id: Sequence, of those not finished
        self.in_flight: Optional[LaunchedStep] = None  # launched, its tokens not yet read back
        self.num_generated_tokens = 0
        self.gc_pauses = GcPauses() if record_timeline else None
        self.arrived = []  # with --timeline, when each request came, until the next step

    def add(self, requests: list) -> list:
        """Queue (seq_id, prompt token ids, SamplingParams) requests; their Sequences."""
        seqs = [Sequence(prompt, params, seq_id, self.eos_token_id) for seq_id, prompt, params in requests]
        self.scheduler.add(seqs)
        if self.record_timeline:
            self.arrived += [time.perf_counter()] * len(seqs)
        self.seqs.update((s.seq_id, s) for s in seqs)
        return seqs

    def abort(self, seq_ids: list) -> None:
        """Stop sequences (a stop string, a client gone): their slots free up at the next step."""
        for seq_id in seq_ids:
            seq = self.seqs.pop(seq_id, None)
            if seq is not None:  # else it ended already
                self.scheduler.finish(seq)

    def has_work(self) -> bool:
        return self.in_flight is not None or self.scheduler.has_work()

    @torch.inference_mode()
    def step(self) -> StepOutputs:
        """Launch the next step, then read back the one before: on a GPU the next computes
        while this one's tokens go out."""
        scheduled = time.perf_counter()
        previous = self.in_flight
        batch = self.scheduler.schedule(previous.seqs if previous else ())
        self.in_flight = None if batch.is_empty() else self.runner.launch(batch, previous)
        launched = time.perf_counter()
        tokens = previous.tokens() if previous else []
        device_done = time.perf_counter()
        outputs = self.take(previous, tokens) if previous else self.outputs([], [], {}, {})
        if self.record_timeline:
            outputs.times = (scheduled, launched, device_done, time.perf_counter())
            outputs.gc_seconds, outputs.arrived, self.arrived = self.gc_pauses.take(), tuple(self.arrived), []
        return outputs

    def take(self, step: LaunchedStep, tokens: list) -> StepOutputs:
        """Append each sequence its token; those that end here (EOS, max_tokens) leave the
        running batch."""
        seq_ids, token_ids, finished, logprobs = [], [], {}, {}
        by_row = step.logprobs()
        for row, (seq, token) in enumerate(zip(step.seqs, tokens)):
            if seq.is_finished:  # aborted after it was launched
                continue
            seq.append(token)
            seq_ids.append(seq.seq_id)
            token_ids.append(token)
            if row in by_row:
                logprobs[seq.seq_id] = by_row[row]
            if seq.finish_reason:
                finished[seq.seq_id] = seq.finish_reason
                self.scheduler.finish(seq)
                del self.seqs[seq.seq_id]
        self.num_generated_tokens += len(token_ids)
        return self.outputs(seq_ids, token_ids, finished, logprobs)

    def outputs(self, seq_ids, token_ids, finished, logprobs) -> StepOutputs:
        return StepOutputs(seq_ids, token_ids, finished, logprobs, len(self.scheduler.running),
                           len(self.scheduler.waiting), self.num_generated_tokens)

    def handle(self, messages: list) -> None:
        """("add", requests) and ("abort", seq ids) messages, in the order they were sent."""
        for kind, payload in messages:
            if kind == "add":
                self.add(payload)
            elif kind == "abort":
                self.abort(payload)
            else:
                raise ValueError(f"unknown message to the engine core: {kind!r}")


def max_num_kv_tokens(args, config: ModelConfig, device: str, max_model_len: int) -> int:
    """How many tokens' K/V the engine may hold at once: admission never reserves more."""
    if args.max_num_kv_tokens:
        return args.max_num_kv_tokens
    if not is_cuda(device):
        return args.max_num_seqs * max_model_len
    element_size = torch.finfo(config.compute_dtype(device)).bits // 8
    bytes_per_token = 2 * config.num_attention_layers * config.num_key_value_heads * config.head_dim * element_size
    free_bytes, _ = torch.cuda.mem_get_info()
    return int(free_bytes * args.kv_memory_fraction) // bytes_per_token


def make_engine_core(args, eos_token_id: Optional[int]) -> EngineCore:
    """The engine made and warmed up, behind a scheduler whose K/V budget it measured."""
    device = resolve_device(args.device)
    config = ModelConfig.load(args.model_config)
    max_model_len = args.max_model_len or config.max_position_embeddings
    runner = ModelRunner(load_engine(args.engine, args.model_config, args.weight_dir, device), device)
    runner.warm_up(args.max_num_seqs, args.max_num_prefill_tokens, max_model_len)
    freeze_start_up_objects()
    scheduler = Scheduler(SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_kv_tokens=max_num_kv_tokens(args, config, device, max_model_len),
        max_num_prefill_tokens=args.max_num_prefill_tokens,
        max_num_waiting=args.max_num_waiting))
    return EngineCore(runner, scheduler, eos_token_id, args.timeline)


def run_engine_core(args, eos_token_id: Optional[int], requests: Connection, outputs: Connection) -> None:
    """The core process: CoreReady (or CoreFailed), then a StepOutputs a step, until the API
    process closes its end (or dies: the same end of file), so no core outlives its server."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the API process's to handle
    if getattr(args, "cuda_visible_devices", None) is not None:  # a replica's GPU: before CUDA starts here
        os.environ["CUDA_VISIBLE_DEVICES"] = args.cuda_visible_devices
    logging.basicConfig(level=args.log_level.upper())
    try:
        core = make_engine_core(args, eos_token_id)
        outputs.send(CoreReady(core.scheduler.config))
        while True:
            if not core.has_work():
                core.handle(requests.recv())  # idle: wait for a request
            while requests.poll():
                core.handle(requests.recv())
            if core.has_work():
                outputs.send(core.step())
    except (EOFError, BrokenPipeError):
        return  # the API process left
    except Exception as error:
        log.exception("the engine core stopped")
        try:
            outputs.send(CoreFailed(f"{type(error).__name__}: {error}"))
        except (BrokenPipeError, OSError):
            pass
