"""The speed-of-light model: the least time a trace can take on a GPU.

Every prefill or decode call is one forward pass, and the passes run one after another.
A pass must at least
  - read every weight of the config's layout (contract.layout) once in the compute dtype,
    except the embedding, of which only the rows of its tokens are read (lm_head, or the
    embedding table when the head is tied, is read whole: every request needs its logits),
    and, in a sparse (mixture-of-experts) layer, the experts its tokens reach only: as many
    as n tokens reach on average under uniform routing, E (1 - (1 - k/E)^n) of E, top k
    (8 at batch 1 on Qwen3-30B-A3B, 126 of 128 at 64);
  - read the cached K/V of its requests (decode) and write the K/V of its new tokens, in
    the layers that attend; in a hybrid's Gated DeltaNet layers (Qwen3.5), read each
    request's recurrent state (fp32) and write it back (a prefill only writes it);
  - write the logits of each request's last token;
  - do 2 FLOPs per weight per token in the linears (lm_head on each request's last token
    only; of the experts, a token's k) and 4 * heads * head_dim FLOPs per attending layer
    for each (query, visible key) pair; in a DeltaNet layer, 8 FLOPs per state element per
    token (decay, recall, update, read).
Its bound is max(bytes / bandwidth, FLOPs / tensor rate); a case's is the sum over its
passes. Not counted: kernel launch and host overhead, activations that could stay
on-chip, and the element-wise work of norms, RoPE and softmax. So the bound is honest
but loose for small models, where launches dominate (../shared/DESIGN.md, "Where the time goes on a GPU").
"""
import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from contract.devices import is_cuda
from contract.layout import weight_shapes
from contract.model_config import ConfigError, ModelConfig
from fitness.cases import CASE_SETS, select_cases
from fitness.traces import Event, count_tokens

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "target" / "model_config.json"


@dataclass(frozen=True)
class GpuPeaks:
    bytes_per_second: float
    flops_per_second: float  # dense fp16/bf16 tensor-core rate


# Measured on this workplace's machines (device/KINDS.md), not datasheet figures: a
# device-to-device copy moved 3.0 TB/s on an H100 and 4.3 TB/s on an H200 (bytes read plus
# written); an 8192^3 bf16 matmul ran at 788-798 TFLOP/s on both.
GPUS = {
    "h100": GpuPeaks(bytes_per_second=3.0e12, flops_per_second=7.9e14),
    "h200": GpuPeaks(bytes_per_second=4.3e12, flops_per_second=7.9e14),
}


@dataclass(frozen=True)
class ForwardPass:
    """One prefill or decode call: per request, tokens already cached and tokens added."""
    num_cached: tuple
    num_new: tuple


def forward_passes(events) -> list:
    """The passes of a trace, tracking each live request's length."""
    lengths, passes = {}, []
    for ev in events:
        if ev.kind == "remove":
            for rid in ev.request_ids:
                lengths.pop(rid, None)
            continue
        if ev.kind == "prefill":  # a prefill replaces whatever the request had
            num_cached, num_new = (0,) * len(ev.lengths), tuple(ev.lengths)
        else:
            dead = [rid for rid in ev.request_ids if rid not in lengths]
            if dead:
                raise ValueError(f"decode of requests that are not live: {dead}")
            num_cached, num_new = tuple(lengths[rid] for rid in ev.request_ids), (1,) * len(ev.request_ids)
        for rid, cached, new in zip(ev.request_ids, num_cached, num_new):
            lengths[rid] = cached + new
        passes.append(ForwardPass(num_cached, num_new))
    return passes


EXPERT = re.compile(r"\.mlp\.experts\.\d+\.")


@dataclass(frozen=True)
class WeightCounts:
    """Weights of a config, counted from its layout (contract.layout), in elements."""
    read_per_pass: int  # every weight but the embedding and the experts, plus the head (the embedding table when tied)
    token_matmul: int  # the layers' matrices one token multiplies (of the experts, its k): 2 FLOPs each
    experts: int = 0  # experts in a sparse layer
    top_k: int = 0
    expert_per_layer: int = 0  # one expert's weights in each sparse layer, summed over those layers

    @classmethod
    def of(cls, c: ModelConfig) -> "WeightCounts":
        shapes = weight_shapes(c.to_dict())
        sizes = {name: math.prod(shape) for name, shape in shapes.items()}
        expert = sum(n for name, n in sizes.items() if EXPERT.search(name) and ".experts.0." in name)
        read = sum(n for name, n in sizes.items() if name != "embed_tokens.weight" and not EXPERT.search(name))
        head = 0 if "lm_head.weight" in shapes else c.vocab_size * c.hidden_size
        dense = sum(n for name, n in sizes.items()
                    if name.startswith("layers.") and len(shapes[name]) == 2 and not EXPERT.search(name))
        return cls(read + head, dense + c.num_experts_per_tok * expert, c.num_experts, c.num_experts_per_tok, expert)

    def experts_read(self, num_tokens: int) -> float:
        """Expert weights a pass of num_tokens reads: those of the experts its tokens reach,
        on average under uniform routing."""
        if not self.experts:
            return 0
        reached = self.experts * (1 - (1 - self.top_k / self.experts) ** num_tokens)
        return reached * self.expert_per_layer


def pass_bytes(c: ModelConfig, w: WeightCounts, p: ForwardPass) -> int:
    num_tokens, num_requests = sum(p.num_new), len(p.num_new)
    embedding_rows = num_tokens * c.hidden_size
    kv_per_token = c.num_attention_layers * 2 * c.num_key_value_heads * c.head_dim
    kv = kv_per_token * (sum(p.num_cached) + num_tokens)  # cached read, new written
    logits = num_requests * c.vocab_size
    element_bytes = c.compute_dtype("cuda").itemsize
    # A DeltaNet's state: read where a request has one (decode), written by every request.
    states = sum((2 if cached else 1) * recurrent_state(c) for cached in p.num_cached) * 4  # fp32
    return round(element_bytes * (w.read_per_pass + w.experts_read(num_tokens) + embedding_rows + kv + logits) + states)


def recurrent_state(c: ModelConfig) -> int:
    """Elements of one request's Gated DeltaNet state over every DeltaNet layer (0 but in a hybrid)."""
    linear = c.num_hidden_layers - c.num_attention_layers
    return linear * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim


def pass_flops(c: ModelConfig, w: WeightCounts, p: ForwardPass) -> int:
    num_tokens, num_requests = sum(p.num_new), len(p.num_new)
    linears = 2 * num_tokens * w.token_matmul
    lm_head = 2 * num_requests * c.hidden_size * c.vocab_size
    # The query at offset j of n new tokens sees cached + j + 1 keys (causal).
    pairs = sum(n * cached + n * (n + 1) // 2 for cached, n in zip(p.num_cached, p.num_new))
    attention = 4 * c.num_attention_heads * c.head_dim * c.num_attention_layers * pairs
    return linears + lm_head + attention + 8 * num_tokens * recurrent_state(c)


def peaks_of(gpu) -> GpuPeaks:
    return gpu if isinstance(gpu, GpuPeaks) else GPUS[gpu]


def case_bound(config: ModelConfig, events, gpu="h100") -> dict:
    """The least time `events` can take on `gpu` (a name in GPUS or a GpuPeaks)."""
    peaks = peaks_of(gpu)
    weights = WeightCounts.of(config)
    total_bytes = total_flops = 0
    seconds = {"memory": 0.0, "compute": 0.0}  # time of the passes each term bounds
    for p in forward_passes(events):
        num_bytes, flops = pass_bytes(config, weights, p), pass_flops(config, weights, p)
        memory_s, compute_s = num_bytes / peaks.bytes_per_second, flops / peaks.flops_per_second
        seconds["memory" if memory_s >= compute_s else "compute"] += max(memory_s, compute_s)
        total_bytes, total_flops = total_bytes + num_bytes, total_flops + flops
    total_seconds = seconds["memory"] + seconds["compute"]
    return {
        "seconds": total_seconds,
        "bytes": total_bytes,
        "flops": total_flops,
        "tokens_per_second": sum(count_tokens(events)) / total_seconds,
        "bound_by": max(seconds, key=seconds.get),
    }


def served_events(concurrency: int, num_requests: int, input_len: int, output_len: int) -> list:
    """A served level (serve.bench) as the engine's calls at best: its requests in waves of
    `concurrency`, each wave one prefill of every prompt (its first token) and output_len - 1
    decode steps of every request. A server that runs a level so keeps `concurrency` in flight."""
    events = []
    for start in range(0, num_requests, concurrency):
        ids = tuple(range(start, min(start + concurrency, num_requests)))
        events += [Event("prefill", ids, (input_len,) * len(ids))] + [Event("decode", ids)] * (output_len - 1)
        events.append(Event("remove", ids))
    return events


def served_bound(config: ModelConfig, concurrency: int, num_requests: int, input_len: int, output_len: int,
                 gpu="h100") -> float:
    """The output tokens/s a served level cannot beat on `gpu` (`served_events`' passes)."""
    seconds = case_bound(config, served_events(concurrency, num_requests, input_len, output_len), gpu)["seconds"]
    return num_requests * output_len / seconds


def roofline_table(config: ModelConfig, cases: dict, gpu="h100") -> list:
    return [{"case_name": name, **case_bound(config, events, gpu)} for name, events in cases.items()]


def known_gpu(device) -> str | None:
    """The GPUS entry for `device`'s GPU; None when it is none of them (or no GPU)."""
    name = torch.cuda.get_device_name(device).lower() if is_cuda(device) else ""
    return next((key for key in GPUS if key in name), None)


def gpu_for_device(device) -> str:
    """known_gpu's entry; "h100" when there is none."""
    return known_gpu(device) or "h100"


def format_table(rows: list) -> str:
    header = f"{'case':<18}{'MB moved':>12}{'GFLOP':>10}{'bound ms':>11}{'tokens/s':>13}  bound by"
    lines = [header]
    for r in rows:
        lines.append(f"{r['case_name']:<18}{r['bytes'] / 1e6:>12.1f}{r['flops'] / 1e9:>10.2f}"
                     f"{r['seconds'] * 1e3:>11.3f}{r['tokens_per_second']:>13,.0f}  {r['bound_by']}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    parser.add_argument("--cases", choices=CASE_SETS, default="public")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def cli(args) -> int:
    """`python -m fitness roofline`: the bound of every case, as a table or JSON."""
    try:
        config = ModelConfig.load(args.model_config)
    except ConfigError as err:
        print(f"roofline: {err}", file=sys.stderr)
        return 2
    rows = roofline_table(config, select_cases(args.cases), args.gpu)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0
