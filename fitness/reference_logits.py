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
against fp32 on the public sequence (at least 1); where it overflows (inf or NaN logits), no
engine in that dtype can be judged (a ConfigError). The contract's format keeps the
contract's rule: the reference in the compute dtype, an allowance of 1.

A mixture of experts routes each token to its top k experts, a discrete choice: where the
router's k-th and (k+1)-th logits are equal within the engine's rounding, an honest engine
may pick the other expert, and that row's logits move by far more than rounding. So the
reference records every sparse layer's router logits (fp32) and finds the near-ties (a k-th
and (k+1)-th logit no further apart than the tie bound). Each row the trace asks for gets a
`TieRule`:
- its own near-tie layers: its logits also computed with the (k+1)-th expert in place of the
  k-th at each combination of them (`alternatives`); the row passes against the nearest;
- near-ties at earlier positions of its request: each flipped alone, what that moves this
  row's logits by (through the K/V of that position), summed per logit (`reach`): the row's
  error is counted past it. To first order a set of flips moves a row by the sum of what each
  moves it by, and an engine flips some set of them.
An exact engine that flips matches one alternative within its reach; a wrong router (every
row, every layer) misses them all. Excused: a row with more than MAX_TIES_A_ROW near-tie
layers, past MAX_FLIPS_A_LIFE earlier flips, or whose reach exceeds MAX_REACH allowances (it
would hide a wrong row); at least MIN_CHECKED_SHARE of a trace's rows must be left to check,
or the gate draws that trace again at other token seeds (fitness.gate.checkable_draw), and
failing those says it cannot judge (a ConfigError, its own verdict, not the candidate's).
The tie bound is TIE_HEADROOM times the router's noise in the dtype an engine computes in on
the judging device (fp32 on a CPU, where it is the rounding of fp32 itself; bf16 or fp16 on a
GPU): twice the largest change of any router logit (a gap is a difference of two) from the
fp32 reference to the reference in that dtype on the public sequence, up to where that one
first routes another way. The allowance is calibrated on the rows before the first position
of their request where the reference in the engine's dtype routes another way than fp32's: a
flipped expert there would widen every tolerance enough to pass a wrong router. Rows that are
merely near a tie count; on a random router in bf16 most rows are, and calibrating on clear
rows alone left none, an allowance of 1 and the seed failed on a GPU.
"""
import hashlib
import itertools
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.checkpoint import load_checked_weights
from contract.model_config import ConfigError, ModelConfig
from fitness import weight_files
from fitness.reference import ReferenceModel
from fitness.tolerance import error_ratio, in_tolerances
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
MAX_FLIPS_A_LIFE = 32  # earlier near-ties whose reach is measured: one forward of the life each
MAX_REACH = 1.0  # allowances: past it a row's reach would let through twice the error it bounds
MIN_CHECKED_SHARE = 0.5


class TooFewRows(ConfigError):
    """A trace whose rows sit too near routing ties for MIN_CHECKED_SHARE of them to be checked
    (fitness.gate.checkable_draw draws it again at another token seed)."""


@dataclass
class TieRule:
    """How one row is checked (the module's docstring): against the nearest of its reference
    and `alternatives`, its error counted past `reach` [vocab] (None: no earlier near-tie)."""
    alternatives: list = field(default_factory=list)
    reach: torch.Tensor | None = None
    excused: bool = False

    @property
    def clear(self) -> bool:
        return not (self.alternatives or self.excused) and self.reach is None


CLEAR, EXCUSED = TieRule(), TieRule(excused=True)


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
        self.rules = {}  # trace key -> per call, each row's TieRule (None for a remove)
        self.computed_s = 0.0  # seconds spent computing traces not kept: a judgement's "references" phase
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
        key = (*model_key(config, weight_dir), str(dtype))
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
            started = time.monotonic()
            calls = materialize(events, config.vocab_size, seed, "cpu")
            model = self.model(config, weight_dir, dtype)
            lives, rows = lifetimes(calls, histories(calls))
            bound = self.tie_bound(config, weight_dir) if config.num_experts else None
            # One forward per request's life, not one per call: 2-core CPU judgements spent
            # 57 of their 91 s recomputing histories (a 1,496-token one four times).
            logits, rules = {}, {}
            for life, (tokens, positions) in enumerate(lives):
                out, tied = life_logits(model, tokens, positions, bound)
                logits.update({(life, p): row for p, row in zip(positions, out.float().cpu())})
                rules.update({(life, p): rule for p, rule in tied.items()})
            self.traces[key] = [None if row is None else torch.stack([logits[r] for r in row]) for row in rows]
            self.rules[key] = [None if row is None else [rules.get(r, CLEAR) for r in row] for row in rows]
            if len(self.traces) > MAX_TRACES:
                self.rules.pop(self.traces.popitem(last=False)[0], None)
            self.computed_s += time.monotonic() - started
        self.traces.move_to_end(key)
        return self.traces[key]

    def row_rules(self, config: ModelConfig, weight_dir, events, seed: int,
                  min_share: float = MIN_CHECKED_SHARE) -> list:
        """Per call (None for a remove), each row's TieRule (the module's docstring), a reach
        past MAX_REACH allowances excused; TooFewRows where fewer than `min_share` of the rows
        are left to check."""
        with self.lock:
            expected, rules = self.trace(config, weight_dir, events, seed), self.trace_rules(config, weight_dir, events, seed)
            limit = MAX_REACH * self.allowance(config, weight_dir)
        rules = [None if call is None else [within_reach(rule, row, limit) for rule, row in zip(call, reference)]
                 for call, reference in zip(rules, expected)]
        rows = [rule for call in rules if call is not None for rule in call]
        checked = sum(not rule.excused for rule in rows)
        if checked < min_share * len(rows):
            raise TooFewRows(f"{weight_dir}: only {checked} of {len(rows)} rows can be checked beside their "
                             f"routing near-ties (router gap under {self.tie_bound(config, weight_dir):.3g}): "
                             f"too few to judge on (at least {min_share:.0%})")
        return rules

    def trace_rules(self, config: ModelConfig, weight_dir, events, seed: int) -> list:
        """Per call (None for a remove), each row's TieRule as the reference found it."""
        with self.lock:
            self.trace(config, weight_dir, events, seed)
            return self.rules[trace_key(config, weight_dir, events, seed, self.dtype(config))]

    def tie_bound(self, config: ModelConfig, weight_dir) -> float:
        """TIE_HEADROOM x the router's noise in the engine's dtype (the module's docstring)."""
        with self.lock:
            key = model_key(config, weight_dir)
            if key not in self.tie_bounds:
                exact = self.model(config, weight_dir, torch.float32)
                rounded = self.model(config, weight_dir, config.compute_dtype(self.device))
                self.tie_bounds[key] = TIE_HEADROOM * router_noise(exact, rounded, public_lives(config))
            return self.tie_bounds[key]

    def allowance(self, config: ModelConfig, weight_dir) -> float:
        """How many tolerances one tolerance of error is worth on this config (the module's
        docstring says why): 1 for the contract's format."""
        with self.lock:
            key = model_key(config, weight_dir)
            if key not in self.allowances:
                self.allowances[key] = self.calibrated(config, weight_dir) if config.is_hf else 1.0
            return self.allowances[key]

    def calibrated(self, config: ModelConfig, weight_dir) -> float:
        """LOW_PRECISION_HEADROOM x the worst error of the reference in the dtype an engine
        computes in on a GPU against the fp32 reference, at least 1."""
        events, low = public_sequence(), config.compute_dtype("cuda")
        exact = self.trace(config, weight_dir, events, CALIBRATION_SEED, torch.float32)
        rounded = self.trace(config, weight_dir, events, CALIBRATION_SEED, low)
        if not all(torch.isfinite(r).all() for r in rounded if r is not None):
            # An allowance of inf would pass any finite logits; an honest engine overflows as this does.
            raise ConfigError(f"{weight_dir}: in {str(low).removeprefix('torch.')} the reference's logits overflow "
                              "(inf or NaN): no engine computing in it can be judged on these weights")
        same = self.same_route_rows(config, weight_dir, events, CALIBRATION_SEED, low)
        noise = max(error_ratio(r[kept], e[kept]) for r, e, kept in zip(rounded, exact, same) if e is not None)
        return max(1.0, LOW_PRECISION_HEADROOM * noise)

    def same_route_rows(self, config: ModelConfig, weight_dir, events, seed: int, dtype) -> list:
        """Per call, the indices of its rows before the first position of their request where
        the reference in `dtype` routes other experts than fp32's (every row of a dense model;
        None for a remove)."""
        calls = materialize(events, config.vocab_size, seed, "cpu")
        lives, rows = lifetimes(calls, histories(calls))
        first = {life: len(tokens) for life, (tokens, _) in enumerate(lives)}
        if config.num_experts:
            exact, rounded = self.model(config, weight_dir, torch.float32), self.model(config, weight_dir, dtype)
            for life, (tokens, _) in enumerate(lives):
                differs = routes_apart(exact, rounded, tokens)[2].any(0)  # [T]: some layer routes it another way
                if differs.any():
                    first[life] = int(differs.nonzero()[0])
        return [None if row is None else [i for i, (life, p) in enumerate(row) if p < first[life]] for row in rows]

    def rows(self, config: ModelConfig, weight_dir, events, seed: int, picks) -> dict:
        """{(call index, row): (reference logits [vocab], its TieRule)} for the picked rows only
        (not kept: timed runs draw fresh tokens every time)."""
        calls = materialize(events, config.vocab_size, seed, "cpu")
        held = histories(calls)
        with self.lock:
            model = self.model(config, weight_dir)
            bound = self.tie_bound(config, weight_dir) if config.num_experts else None
            limit = MAX_REACH * self.allowance(config, weight_dir)
            picked = {}
            for i, row in picks:
                tokens = held[i][calls[i].event.request_ids[row]]
                out, tied = life_logits(model, tokens, [len(tokens) - 1], bound)
                logits = out[0].float().cpu()
                picked[i, row] = logits, within_reach(tied.get(len(tokens) - 1, CLEAR), logits, limit)
            return picked


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


def model_key(config: ModelConfig, weight_dir) -> tuple:
    return json.dumps(config.to_dict(), sort_keys=True), str(Path(weight_dir).resolve())


def trace_key(config: ModelConfig, weight_dir, events, seed: int, dtype) -> str:
    return hashlib.sha256(json.dumps([*model_key(config, weight_dir), [e.__dict__ for e in events], seed, str(dtype)],
                                     sort_keys=True, default=str).encode()).hexdigest()


def within_reach(rule: TieRule, reference, limit: float) -> TieRule:
    """`rule`, or EXCUSED where its reach exceeds `limit` tolerances of `reference` somewhere."""
    if rule.reach is None or in_tolerances(rule.reach, reference) <= limit:
        return rule
    return EXCUSED


def routed_forward(model: ReferenceModel, tokens, positions=None) -> tuple:
    """(logits at `positions`, each sparse layer's router logits [T, E] in fp32) of one life."""
    model.routing = []
    try:
        return model.forward(tokens, positions), model.routing
    finally:
        model.routing = None


def boundary_gaps(routing: list, k: int) -> torch.Tensor:
    """[3, sparse layers, T]: each position's gaps between its (k-1)-th and k-th, k-th and
    (k+1)-th, (k+1)-th and (k+2)-th router logits (inf where there is no such expert)."""
    values = torch.stack([layer.sort(dim=-1, descending=True).values for layer in routing])  # [layers, T, E]
    if k == values.shape[-1]:  # every expert taken: no boundary to fall on either side of
        return torch.full((3, *values.shape[:2]), float("inf"), device=values.device)
    inf = torch.full((*values.shape[:2], 1), float("inf"), device=values.device)
    ranked = torch.cat((inf, values, -inf, -inf), -1)  # ranked[..., r] is the r-th largest, from 1
    return torch.stack([ranked[..., r] - ranked[..., r + 1] for r in (k - 1, k, k + 1)]).nan_to_num(float("inf"))


def life_logits(model: ReferenceModel, tokens, positions, bound) -> tuple:
    """(logits at `positions`, {position: its TieRule} for those routed near a tie: a gap of at
    most `bound` at some sparse layer, at that position or an earlier one). `bound` None for a
    dense model."""
    if bound is None:
        return model.forward(tokens, positions), {}
    out, routing = routed_forward(model, tokens, positions)
    gaps = boundary_gaps(routing, model.config.num_experts_per_tok) <= bound  # [3, sparse layers, T]
    near = gaps[1]
    # Three or more experts within the bound across the boundary: one swap does not cover what
    # an engine may pick there, so that row and every later one of the life are excused.
    wide = (near & (gaps[0] | gaps[2])).any(0).nonzero().flatten().tolist()
    sparse = [i for i in range(model.config.num_hidden_layers) if model.config.is_sparse_layer(i)]
    ties = sorted((q, sparse[j]) for j, q in near.nonzero().tolist() if not wide or q < wide[0])
    reach = flips_reach(model, tokens, positions, out, ties + ([(wide[0], None)] if wide else []))
    rules = {}
    for p in positions:
        layers = [sparse[j] for j in near[:, p].nonzero().flatten().tolist()]
        if p in reach and reach[p] is None or len(layers) > MAX_TIES_A_ROW or wide and p >= wide[0]:
            rules[p] = EXCUSED
        elif layers or p in reach:
            rules[p] = TieRule(flipped_rows(model, tokens[:p + 1], layers) if layers else [], reach.get(p))
    return out, rules


def flips_reach(model: ReferenceModel, tokens, positions, out, ties: list) -> dict:
    """{position: what flipping each near-tie (position, layer) before it, one at a time, moves
    its logits by, summed per logit [vocab]}; None past MAX_FLIPS_A_LIFE of them or past a
    wide tie (layer None)."""
    reach, index = {}, {p: i for i, p in enumerate(positions)}
    for n, (q, layer) in enumerate(ties):
        later = [p for p in positions if p > q]
        if not later:
            break
        if n == MAX_FLIPS_A_LIFE or layer is None:  # too many to measure, or a wide tie
            reach.update({p: None for p in later})
            break
        moved = flipped_forward(model, {layer: [q]}, tokens[:later[-1] + 1], later).float()
        for p, change in zip(later, (moved - out[[index[p] for p in later]].float()).abs().cpu()):
            reach[p] = reach[p] + change if p in reach else change
    return reach


def flipped_rows(model: ReferenceModel, tokens, layers: list) -> list:
    """The last position's logits [vocab] with its k-th expert swapped for the (k+1)-th at each
    non-empty combination of `layers`."""
    last = len(tokens) - 1
    return [flipped_forward(model, {layer: [last] for layer in chosen}, tokens, [last])[0].float().cpu()
            for n in range(1, len(layers) + 1) for chosen in itertools.combinations(layers, n)]


def flipped_forward(model: ReferenceModel, flips: dict, tokens, positions) -> torch.Tensor:
    """The model's logits at `positions` with `flips` ({layer: positions}) routed to the
    (k+1)-th expert in place of the k-th."""
    model.flips = flips
    try:
        return model.forward(tokens, positions)
    finally:
        model.flips = {}


def public_lives(config: ModelConfig) -> list:
    """The tokens each request holds at the end of its life in the public sequence."""
    return [tokens for tokens, _ in public_lives_with_positions(config)]


def public_lives_with_positions(config: ModelConfig) -> list:
    """(tokens, the positions the calls ask for) of each life in the public sequence."""
    calls = materialize(public_sequence(), config.vocab_size, CALIBRATION_SEED, "cpu")
    return lifetimes(calls, histories(calls))[0]


def routes_apart(exact: ReferenceModel, rounded: ReferenceModel, tokens) -> tuple:
    """(exact's router logits, rounded's, both [sparse layers, T, E], and where their top k
    differ [sparse layers, T]) over the sequence `tokens`."""
    a, b = (torch.stack(routed_forward(m, tokens, [len(tokens) - 1])[1]) for m in (exact, rounded))
    chosen = [x.topk(exact.config.num_experts_per_tok, dim=-1).indices.sort(-1).values for x in (a, b)]
    return a, b, (chosen[0] != chosen[1]).any(-1)


def router_noise(exact: ReferenceModel, rounded: ReferenceModel, lives: list) -> float:
    """2 x the largest change of a router logit from `exact` to `rounded`, over each life's
    positions before the first where `rounded` picks other experts, and that one's layers up to
    the one where it does (past it, `rounded`'s hidden states took another path); at least the
    rounding of `rounded`'s dtype at the largest logit."""
    worst = 0.0
    for tokens in lives:
        a, b, differs = routes_apart(exact, rounded, tokens)
        change = (a - b).abs().amax(-1)  # [layers, T]
        if differs.any():  # the positions before the first other route; at it, its layers up to that one
            upto = int(differs.any(0).nonzero()[0])
            layer = int(differs[:, upto].nonzero()[0])
            change = torch.cat((change[:, :upto].flatten(), change[:layer + 1, upto]))
        worst = max(worst, change.max().item(), torch.finfo(rounded.dtype).eps * a.abs().max().item())
    return 2 * worst
