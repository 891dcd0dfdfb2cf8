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

A mixture of experts routes each token to its top k experts, a discrete choice: where the
router's k-th and (k+1)-th logits are equal within the engine's rounding, an honest engine
may pick the other expert, and that row's logits move by far more than rounding. So the
reference records every sparse layer's router logits (fp32), and where a row the trace asks
for is a near-tie at some layers (its k-th and (k+1)-th logits no further apart than the tie
bound), it also computes that row with the (k+1)-th expert in place of the k-th at each
combination of those layers: the row passes against whichever of them it is nearest
(`row_alternatives`). An exact engine that flips there matches one of them; a wrong router
still misses every one, and every row that is not a near-tie. A flip changes that position's
K/V, so the later rows of its request are excused, as is a row with more than MAX_TIES_A_ROW
near-tie layers; at least MIN_CHECKED_SHARE of a trace's rows must be left to check, or the
judge says it cannot judge (a ConfigError, its own verdict, not the candidate's).
The tie bound is TIE_HEADROOM times the router's noise in the dtype an engine computes in on
the judging device (fp32 on a CPU, where it is the rounding of fp32 itself; bf16 or fp16 on a
GPU): twice the largest change of any router logit (a gap is a difference of two) from the
fp32 reference to the reference in that dtype on the public sequence, up to where that one
first routes another way. The allowance is calibrated on rows whose routing is clear (a
flipped expert there would widen every tolerance enough to pass a wrong router).
"""
import hashlib
import itertools
import json
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from contract.checkpoint import load_checked_weights
from contract.model_config import ConfigError, ModelConfig
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
# A row is a near-tie within TIE_HEADROOM x the router's measured noise: an engine's kernels
# round its router differently from the reference's, not less (as LOW_PRECISION_HEADROOM).
TIE_HEADROOM = 2
MAX_TIES_A_ROW = 3  # sparse layers at a near-tie in one row: 2^3 - 1 alternatives at the most
MIN_CHECKED_SHARE = 0.5
# A row is a near-tie within TIE_HEADROOM x the router's measured noise: an engine's kernels
# round its router differently from the reference's, not less (as LOW_PRECISION_HEADROOM).
TIE_HEADROOM = 2
MIN_CHECKED_SHARE = 0.5


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
        self.tie_bounds = {}  # (config, weight dir) -> the router gap under which a row is a near-tie
        self.alternatives = {}  # trace key -> per call, each row's alternative logits (None for a remove)
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
        key = trace_key(config, weight_dir, events, seed, dtype)
        if key not in self.traces:
            calls = materialize(events, config.vocab_size, seed, "cpu")
            model = self.model(config, weight_dir, dtype)
            lives, rows = lifetimes(calls, histories(calls))
            bound = self.tie_bound(config, weight_dir) if config.num_experts else None
            # One forward per request's life, not one per call: 2-core CPU judgements spent
            # 57 of their 91 s recomputing histories (a 1,496-token one four times).
            logits, alternatives = {}, {}
            for life, (tokens, positions) in enumerate(lives):
                out, flipped = life_logits(model, tokens, positions, bound)
                logits.update({(life, p): row for p, row in zip(positions, out.float().cpu())})
                alternatives.update({(life, p): rows for p, rows in flipped.items()})
            self.traces[key] = [None if row is None else torch.stack([logits[r] for r in row]) for row in rows]
            self.alternatives[key] = [None if row is None else [alternatives.get(r, []) for r in row] for row in rows]
            if len(self.traces) > MAX_TRACES:
                self.alternatives.pop(self.traces.popitem(last=False)[0], None)
        self.traces.move_to_end(key)
        return self.traces[key]

    def row_alternatives(self, config: ModelConfig, weight_dir, events, seed: int, dtype=None) -> list:
        """Per call (None for a remove), each row's alternative logits (the module's docstring):
        [] where its routing is clear, None where it is excused; a ConfigError where fewer than
        MIN_CHECKED_SHARE of the rows are left to check."""
        with self.lock:
            dtype = dtype or self.dtype(config)
            self.locked_trace(config, weight_dir, events, seed, dtype)
            alternatives = self.alternatives[trace_key(config, weight_dir, events, seed, dtype)]
        rows = [row for call in alternatives if call is not None for row in call]
        checked = sum(row is not None for row in rows)
        if checked < MIN_CHECKED_SHARE * len(rows):
            raise ConfigError(f"{weight_dir}: only {checked} of {len(rows)} rows have at most {MAX_TIES_A_ROW} "
                              f"routing near-ties (router gap under {self.tie_bound(config, weight_dir):.3g}): "
                              f"too few to judge on (at least {MIN_CHECKED_SHARE:.0%})")
        return alternatives

    def tie_bound(self, config: ModelConfig, weight_dir) -> float:
        """TIE_HEADROOM x the router's noise in the engine's dtype (the module's docstring)."""
        with self.lock:
            key = (json.dumps(config.to_dict(), sort_keys=True), str(Path(weight_dir).resolve()))
            if key not in self.tie_bounds:
                exact = self.model(config, weight_dir, torch.float32)
                rounded = self.model(config, weight_dir, config.compute_dtype(self.device))
                self.tie_bounds[key] = TIE_HEADROOM * router_noise(exact, rounded, public_lives(config))
            return self.tie_bounds[key]

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
        ties = self.alternatives[trace_key(config, weight_dir, events, CALIBRATION_SEED, torch.float32)]
        rounded = self.trace(config, weight_dir, events, CALIBRATION_SEED, config.compute_dtype("cuda"))
        noise = max(error_ratio(r[kept], e[kept]) for r, e, kept in zip(rounded, exact, clear_rows(ties))
                    if e is not None)
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


def trace_key(config: ModelConfig, weight_dir, events, seed: int, dtype) -> str:
    return hashlib.sha256(json.dumps([config.to_dict(), str(Path(weight_dir).resolve()), [e.__dict__ for e in events],
                                      seed, str(dtype)], sort_keys=True, default=str).encode()).hexdigest()


def clear_rows(alternatives: list) -> list:
    """Per call, the indices of its rows whose routing is no near-tie (None for a remove)."""
    return [None if call is None else [i for i, alts in enumerate(call) if alts == []] for call in alternatives]


def routed_forward(model: ReferenceModel, tokens, positions=None) -> tuple:
    """(logits at `positions`, each sparse layer's router logits [T, E] in fp32) of one life."""
    model.routing = []
    try:
        return model.forward(tokens, positions), model.routing
    finally:
        model.routing = None


def boundary_gaps(routing: list, k: int) -> torch.Tensor:
    """[sparse layers, T]: the gap between each position's k-th and (k+1)-th router logits."""
    if k == routing[0].shape[-1]:  # every expert taken: no boundary to fall on either side of
        return torch.full((len(routing), routing[0].shape[0]), float("inf"))
    top = torch.stack([layer.topk(k + 1, dim=-1).values for layer in routing])  # [layers, T, k+1]
    return top[..., k - 1] - top[..., k]


def life_logits(model: ReferenceModel, tokens, positions, bound) -> tuple:
    """(logits at `positions`, {position: its alternatives}) for the positions whose routing is
    a near-tie (a gap of at most `bound` at some sparse layer): its logits with the (k+1)-th
    expert at each non-empty combination of those layers; None (excused) past MAX_TIES_A_ROW
    of them, or after an earlier position's near-tie. `bound` None for a dense model."""
    if bound is None:
        return model.forward(tokens, positions), {}
    out, routing = routed_forward(model, tokens, positions)
    near = boundary_gaps(routing, model.config.num_experts_per_tok) <= bound  # [sparse layers, T]
    sparse = [i for i in range(model.config.num_hidden_layers) if model.config.is_sparse_layer(i)]
    ties = near.any(0).nonzero().flatten().tolist()
    flipped = {}
    for p in positions:
        layers = [sparse[j] for j in near[:, p].nonzero().flatten().tolist()]
        if ties and ties[0] < p or len(layers) > MAX_TIES_A_ROW:  # an earlier flip changed its K/V
            flipped[p] = None
        elif layers:
            flipped[p] = flipped_rows(model, tokens[:p + 1], layers)
    return out, flipped


def flipped_rows(model: ReferenceModel, tokens, layers: list) -> list:
    """The last position's logits [vocab] with its k-th expert swapped for the (k+1)-th at each
    non-empty combination of `layers`."""
    rows, last = [], len(tokens) - 1
    for n in range(1, len(layers) + 1):
        for chosen in itertools.combinations(layers, n):
            model.flips = {layer: [last] for layer in chosen}
            try:
                rows.append(model.forward(tokens, [last])[0].float().cpu())
            finally:
                model.flips = {}
    return rows


def public_lives(config: ModelConfig) -> list:
    """The tokens each request holds at the end of its life in the public sequence."""
    calls = materialize(public_sequence(), config.vocab_size, CALIBRATION_SEED, "cpu")
    return [tokens for tokens, _ in lifetimes(calls, histories(calls))[0]]


def router_noise(exact: ReferenceModel, rounded: ReferenceModel, lives: list) -> float:
    """2 x the largest change of a router logit from `exact` to `rounded`, over each life's
    positions up to the first where `rounded` picks other experts (past it, that one's hidden
    states took another path); at least the rounding of `rounded`'s dtype at the largest logit."""
    k, worst = exact.config.num_experts_per_tok, 0.0
    for tokens in lives:
        a = torch.stack(routed_forward(exact, tokens, [len(tokens) - 1])[1])  # [layers, T, E]
        b = torch.stack(routed_forward(rounded, tokens, [len(tokens) - 1])[1])
        chosen = [x.topk(k, dim=-1).indices.sort(-1).values for x in (a, b)]
        differs = (chosen[0] != chosen[1]).any(-1).any(0)  # [T]
        upto = int(differs.nonzero()[0]) + 1 if differs.any() else len(tokens)
        worst = max(worst, (a - b)[:, :upto].abs().max().item(), torch.finfo(rounded.dtype).eps * a.abs().max().item())
    return 2 * worst
