"""Reference logits, computed in the judge's own process (where no candidate ever runs)
and kept: once per (config, weights, trace, token seed), however many candidates are
compared with them.

A trace's calls are drawn by fitness.traces.materialize from a seed on a CPU generator,
so the judge and the runner draw the same tokens without sending them. The reference runs
each request's whole history at batch size 1, as the contract's does: once per request's
life, each call's logits read at its last position (causal attention makes them those of
the history up to that call).
"""
import hashlib
import json
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from fitness import weight_files
from fitness.checkpoint import load_checked_weights
from fitness.model_config import ModelConfig
from fitness.reference import ReferenceModel
from fitness.traces import materialize

MAX_TRACES = 256  # kept traces, least recently used dropped first
MAX_MODELS = 8  # reference models on the device: the target, its stress weights, derived configs


def histories(calls) -> list:
    """Per call, {request id: every token it holds after the call} (CPU tensors)."""
    held, after = {}, []
    for call in calls:
        ids = call.event.request_ids
        if call.event.kind == "prefill":
            for rid, tokens in zip(ids, call.tokens):
                held[rid] = tokens.reshape(-1).cpu()
        elif call.event.kind == "decode":
            for rid, token in zip(ids, call.tokens.reshape(-1).cpu()):
                held[rid] = torch.cat((held[rid], token.reshape(1)))
        else:
            for rid in ids:
                held.pop(rid, None)
        after.append(dict(held))
    return after


class References:
    def __init__(self, device: str):
        self.device = device
        self.models, self.traces = OrderedDict(), OrderedDict()
        # A group's gates run in threads: one computes a reference at a time, and the
        # others find it made.
        self.lock = threading.RLock()

    def model(self, config: ModelConfig, weight_dir) -> ReferenceModel:
        with self.lock:
            return self.locked_model(config, weight_dir)

    def locked_model(self, config: ModelConfig, weight_dir) -> ReferenceModel:
        key = (json.dumps(config.to_dict(), sort_keys=True), str(Path(weight_dir).resolve()))
        if key not in self.models:
            if len(self.models) >= MAX_MODELS:
                self.models.popitem(last=False)
            weight_files.TRUSTED.trust(weight_dir)  # as first read, or as trusted: not a candidate's
            weights = load_checked_weights(config, weight_dir)
            weight_files.TRUSTED.trust(weight_dir)  # and not changed while it was read
            self.models[key] = ReferenceModel(config, weights, self.device)
        self.models.move_to_end(key)
        return self.models[key]

    def trace(self, config: ModelConfig, weight_dir, events, seed: int) -> list:
        """Per call, the reference logits [B, vocab] (float32, CPU), None for a remove."""
        with self.lock:
            return self.locked_trace(config, weight_dir, events, seed)

    def locked_trace(self, config: ModelConfig, weight_dir, events, seed: int) -> list:
        key = hashlib.sha256(json.dumps([config.to_dict(), str(Path(weight_dir).resolve()),
                                         [e.__dict__ for e in events], seed], sort_keys=True,
                                        default=str).encode()).hexdigest()
        if key not in self.traces:
            calls = materialize(events, config.vocab_size, seed, "cpu")
            model = self.model(config, weight_dir)
            lives, rows = lifetimes(calls, histories(calls))
            # One forward per request's life, not one per call: 2-core CPU judgements spent
            # 57 of their 91 s recomputing histories (a 1,496-token one four times).
            logits = {}
            for life, (tokens, positions) in enumerate(lives):
                out = model.forward(tokens, positions).float().cpu()
                logits.update({(life, p): row for p, row in zip(positions, out)})
            self.traces[key] = [None if row is None else torch.stack([logits[r] for r in row]) for row in rows]
            if len(self.traces) > MAX_TRACES:
                self.traces.popitem(last=False)
        self.traces.move_to_end(key)
        return self.traces[key]

    def rows(self, config: ModelConfig, weight_dir, events, seed: int, picks) -> dict:
        """{(call index, row): reference logits [vocab]} for the picked rows only (not kept:
        timed runs draw fresh tokens every time)."""
        calls = materialize(events, config.vocab_size, seed, "cpu")
        held = histories(calls)
        model = self.model(config, weight_dir)
        with self.lock:
            return {(i, row): row_logits(model, held[i][calls[i].event.request_ids[row]]) for i, row in picks}


def lifetimes(calls, held) -> tuple:
    """Each request's lives (a prefill to its remove or the trace's end: an id can be
    reused) as (the tokens it holds at its last call, the sorted positions whose logits
    the calls ask for), and per call the (life, position) of each row, None for a remove."""
    current, ends, wanted, rows = {}, [], [], []
    for i, call in enumerate(calls):
        if call.event.kind == "remove":
            for rid in call.event.request_ids:
                current.pop(rid, None)
            rows.append(None)
            continue
        row = []
        for rid in call.event.request_ids:
            if call.event.kind == "prefill" or rid not in current:
                current[rid] = len(ends)
                ends.append(None)
                wanted.append(set())
            life, tokens = current[rid], held[i][rid]
            ends[life] = tokens
            wanted[life].add(tokens.numel() - 1)
            row.append((life, tokens.numel() - 1))
        rows.append(row)
    return [(tokens, sorted(positions)) for tokens, positions in zip(ends, wanted)], rows


def row_logits(model: ReferenceModel, tokens) -> torch.Tensor:
    return model.last_logits(tokens).float().cpu()
