"""Reference logits, computed in the judge's own process (where no candidate ever runs)
and kept: once per (config, weights, trace, token seed), however many candidates are
compared with them.

A trace's calls are drawn by fitness.traces.materialize from a seed on a CPU generator,
so the judge and the runner draw the same tokens without sending them. The reference runs
each request's whole history at batch size 1, as the contract's does: once per request's
life, each call's logits read at its last position (causal attention makes them those of
the history up to that call).

A Hugging Face checkpoint's references are computed in fp32, and its gate is calibrated:
an engine computes in bf16 (or fp16) on a GPU, and how far that rounding alone takes
logits from fp32 depends on the checkpoint (real weights give logits of order 10, not the
toy models' 0.5). So one tolerance of error is worth `allowance` tolerances there:
LOW_PRECISION_HEADROOM times the error of the reference itself, run in the engine's dtype,
against fp32 on the public sequence (at least 1). The contract's format keeps the
contract's rule: the reference in the compute dtype, an allowance of 1.
"""
import hashlib
import json
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from contract.checkpoint import load_checked_weights
from contract.model_config import ModelConfig
from fitness import weight_files
from fitness.reference import ReferenceModel
from fitness.tolerance import error_ratio
from fitness.traces import materialize, public_sequence

MAX_TRACES = 256  # kept traces, least recently used dropped first
MAX_MODELS = 8  # reference models on the device: the target, its stress weights, derived configs
# An honest low-precision engine rounds differently from the reference, not less, and over
# more traces than the calibration's: on the tests' bf16 checkpoints (tests/test_hf.py) the
# seed and a program of the recipe's CPU alleles, both in bf16, scored up to 2.3x the
# reference's own error on the public sequence, so 8 leaves them at 0.29 of the allowance
# (the target's limit is 0.5); planted layout bugs scored 3 to 11 allowances.
LOW_PRECISION_HEADROOM = 8
CALIBRATION_SEED = 0


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
        self.allowances = {}  # (config, weight dir) -> tolerances one tolerance is worth
        # A group's gates run in threads: one computes a reference at a time, and the
        # others find it made.
        self.lock = threading.RLock()

    def dtype(self, config: ModelConfig):
        """What references are computed in: the contract's compute dtype on this device; fp32
        for a Hugging Face checkpoint (its gate is calibrated instead: `allowance`)."""
        return torch.float32 if config.is_hf else config.compute_dtype(self.device)

    def model(self, config: ModelConfig, weight_dir, dtype=None) -> ReferenceModel:
        with self.lock:
            return self.locked_model(config, weight_dir, dtype or self.dtype(config))

    def locked_model(self, config: ModelConfig, weight_dir, dtype) -> ReferenceModel:
        key = (json.dumps(config.to_dict(), sort_keys=True), str(Path(weight_dir).resolve()), str(dtype))
        if key not in self.models:
            if len(self.models) >= MAX_MODELS:
                self.models.popitem(last=False)
            weight_files.TRUSTED.trust(weight_dir)  # as first read, or as trusted: not a candidate's
            weights = load_checked_weights(config, weight_dir)
            weight_files.TRUSTED.trust(weight_dir)  # and not changed while it was read
            self.models[key] = ReferenceModel(config, weights, self.device, dtype)
        self.models.move_to_end(key)
        return self.models[key]

    def trace(self, config: ModelConfig, weight_dir, events, seed: int, dtype=None) -> list:
        """Per call, the reference logits [B, vocab] (float32, CPU), None for a remove."""
        with self.lock:
            return self.locked_trace(config, weight_dir, events, seed, dtype or self.dtype(config))

    def locked_trace(self, config: ModelConfig, weight_dir, events, seed: int, dtype) -> list:
        key = hashlib.sha256(json.dumps([config.to_dict(), str(Path(weight_dir).resolve()),
                                         [e.__dict__ for e in events], seed, str(dtype)], sort_keys=True,
                                        default=str).encode()).hexdigest()
        if key not in self.traces:
            calls = materialize(events, config.vocab_size, seed, "cpu")
            model = self.model(config, weight_dir, dtype)
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

    def allowance(self, config: ModelConfig, weight_dir) -> float:
        """How many tolerances one tolerance of error is worth on this config (the module's
        docstring says why): 1 for the contract's format."""
        with self.lock:
            key = (json.dumps(config.to_dict(), sort_keys=True), str(Path(weight_dir).resolve()))
            if key not in self.allowances:
                self.allowances[key] = self.calibrated(config, weight_dir) if config.is_hf else 1.0
            return self.allowances[key]

    def calibrated(self, config: ModelConfig, weight_dir) -> float:
        """LOW_PRECISION_HEADROOM x the worst error of the reference in the dtype an engine
        computes in on a GPU against the fp32 reference, at least 1."""
        events = public_sequence()
        exact = self.trace(config, weight_dir, events, CALIBRATION_SEED, torch.float32)
        rounded = self.trace(config, weight_dir, events, CALIBRATION_SEED, config.compute_dtype("cuda"))
        noise = max(error_ratio(r, e) for r, e in zip(rounded, exact) if e is not None)
        return max(1.0, LOW_PRECISION_HEADROOM * noise)

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
