"""The correctness gate: static checks, then logits against the reference on every call.

Stage "static": the file parses, defines `create_engine`, imports only the stdlib, torch,
triton and safetensors (to read a Hugging Face checkpoint), and reaches for none of the
harness's state.
Stage "target": the public sequence and randomised traces on the target config and
weights, then the cheap traces again with unit-scaled weights of the same shape (the
public 0.02 initialisation leaves logits so small that atol hides real faults).
Stage "derived": cheap traces on configs the candidate was not tuned on (GQA, the other
GPU dtype: bf16, or fp16 for a bf16 target; other head_dim, more layers, the Hugging Face
families' features), each with its own generated weights (`judging_weights`). A failure on
the families config is run again with each feature alone, so the verdict names the one a
program gets wrong.
A candidate that raises on a config leaves `run_gate` as a `GateFailure` naming it.

The error of a call is max |s - r| / (atol + rtol * |r|): 1.0 is the evaluator's limit
(for a Hugging Face checkpoint, over an allowance calibrated on the reference's own
rounding in bf16 or fp16: fitness.reference_logits).
On the target weights a candidate passes only under `margin` (0.5 by default): hidden
weights and traces differ from ours, so one that scrapes through here fails there. The
unit-scaled and derived configs are there to expose structural faults (errors of 100x and
more) and amplify fp16 rounding too (a reference-exact engine measured 0.48 on an H100),
so they are held to the evaluator's own limit. Reference logits are computed and compared
in the judge's process (fitness.judge); the candidate runs in another (fitness.runner)
and never sees them.
"""
import ast
import hashlib
import json
import random
import sys
import threading
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from contract.checkpoint import CONTRACT_FILE, SAFETENSORS_FILE, to_hf_layout
from contract.families import FEATURES
from contract.model_config import ConfigError, ModelConfig, derived_configs
from fitness import traces, weight_files
from fitness.candidate import RunnerFailure
from fitness.reference_logits import MIN_CHECKED_SHARE, References, TooFewRows
from fitness.runner import retained_bytes
from fitness.tolerance import error_ratio
from target.toy_weights import PUBLIC_STD, generate as generate_weights, save_atomically

DEFAULT_MARGIN = 0.5
STRESS_MARGIN = 1.0  # unit-scaled and derived configs: the evaluator's own limit
ALLOWED_THIRD_PARTY = {"torch", "triton", "safetensors"}
# Stdlib modules that reach into the judging process rather than compute anything.
FORBIDDEN_MODULES = {"importlib", "gc", "inspect", "ctypes", "subprocess", "socket",
                     "multiprocessing", "builtins", "pickle", "marshal"}
FORBIDDEN_CALLS = {"__import__", "eval", "exec", "globals", "breakpoint"}
DERIVED_WEIGHT_SEED = 4321
# A trace whose rows sit too near routing ties to judge on is drawn again at the next of these
# token seeds (seed + k x REDRAW_STRIDE): on a GPU a bf16 hybrid's derived configs left too few
# rows for about half the seeds (docs/log/2026-11-30-twenty-minute-run-ten-minute-qwen3-gate-seeds.md).
REDRAWS = 4
REDRAW_STRIDE = 1_000_003
FAMILIES = "families"  # the derived config with every family's feature on (contract.model_config)
# Raised in a check by the judge's side, not the candidate's: they keep their own verdicts.
JUDGES_OWN = (ConfigError, weight_files.WeightsChanged)


class CorrectnessError(AssertionError):
    """A call whose logits are wrong (or of the wrong shape); the message says where."""


class GateFailure(Exception):
    """The candidate raised, or its runner failed, on one config of the gate. `where` is
    "stage/label" (on the families config, with the features that fail alone); `cause` is
    the original, whose kind sets the verdict (crash, timeout)."""

    def __init__(self, stage: str, label: str, where: str, cause: Exception):
        super().__init__(f"{where}: {cause}")
        self.stage, self.label, self.where, self.cause = stage, label, where, cause


@dataclass
class GateResult:
    passed: bool
    stage: str = ""  # the stage that failed, "" when passed
    case: str = ""  # config/trace/step of the failing (or worst) call
    error: str = ""
    worst_ratio: float = 0.0  # worst error over every call, as a fraction of the tolerance
    worst_case: str = ""
    seed: int = 0
    num_calls: int = 0
    stages: dict = field(default_factory=dict)  # stage -> worst ratio seen there

    def to_dict(self) -> dict:
        return asdict(self)


# --- stage 1: static ---------------------------------------------------------------------

def static_problems(source: str) -> list:
    """Why this source cannot be a candidate; an empty list when it can."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [f"syntax error line {err.lineno}: {err.msg}"]
    problems = []
    if not any(isinstance(n, ast.FunctionDef) and n.name == "create_engine" for n in tree.body):
        problems.append("no top-level def create_engine")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] if node.level == 0 else ["." * node.level]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            problems.append(f"line {node.lineno}: calls {node.func.id}()")
            continue
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top in FORBIDDEN_MODULES or not top:
                problems.append(f"line {node.lineno}: imports {module or 'a relative module'}")
            elif top not in ALLOWED_THIRD_PARTY and top not in sys.stdlib_module_names:
                problems.append(f"line {node.lineno}: imports {module}, outside stdlib/torch/triton/safetensors")
    return problems


# --- stages 2 and 3: correctness -----------------------------------------------------------

@dataclass
class Tally:
    """The worst error seen so far, and where, across every checked call."""
    margin: float
    worst: float = 0.0
    worst_case: str = ""
    num_calls: int = 0

    def record(self, ratio: float, where: str) -> None:
        self.num_calls += 1
        if ratio > self.worst or ratio != ratio:
            self.worst, self.worst_case = ratio, where
        if not ratio <= self.margin:
            raise CorrectnessError(f"{where}: error {ratio:.3g} x tolerance (limit {self.margin})")


def check_outputs(outputs: list, references: list, events, label: str, tally: Tally,
                  vocab_size: int, allowance: float = 1.0, rules: list = None) -> None:
    """Compare one trace's outputs (one per call, None for removes) with its references;
    errors count in units of `allowance` tolerances (fitness.reference_logits says why). A row
    routed near a tie is checked by its TieRule (`rules`: per call, per row)."""
    if len(outputs) != len(events):
        raise CorrectnessError(f"{label}: {len(outputs)} outputs for {len(events)} calls")
    for i, (output, expected, event) in enumerate(zip(outputs, references, events)):
        if event.kind == "remove":
            continue
        where = f"{label}/{event.name or event.kind}#{i}"
        output = snapshot(output, where, (len(event.request_ids), vocab_size))
        if rules is None or all(rule.clear for rule in rules[i]):  # no row routed near a tie
            tally.record(error_ratio(output, expected) / allowance, where)
        else:
            tally.record(max((tied_error(output[r], expected[r], rule) for r, rule in enumerate(rules[i])),
                             default=0.0) / allowance, where)


def tied_error(row, expected, rule) -> float:
    """A row's error by its TieRule: against the nearest of its reference and alternatives,
    counted past its reach; 0 where it is excused."""
    if rule.excused:
        return 0.0
    return min(error_ratio(row, e, rule.reach) for e in (expected, *rule.alternatives))


def snapshot(output, where: str, shape: tuple):
    """A float CPU copy, once the output is known to be logits of the right shape."""
    if not torch.is_tensor(output):
        raise CorrectnessError(f"{where}: returned {output if isinstance(output, str) else type(output).__name__}, "
                               "not a tensor")
    if tuple(output.shape) != shape:
        raise CorrectnessError(f"{where}: logits of shape {tuple(output.shape)}, expected {shape}")
    return output.detach().float().cpu()


class InProcessDriver:
    """Runs traces on an imported module in this process: `python -m fitness check`, which
    calls the engine as the public evaluator does. Judging uses the runner process instead
    (fitness.judge), where the candidate cannot reach the references or the clock."""

    def __init__(self, module, device: str):
        self.module, self.device, self.engine = module, device, None

    def run_trace(self, config: ModelConfig, weight_dir, events, seed: int, new_engine: bool = True) -> list:
        calls = traces.materialize(events, config.vocab_size, seed, self.device)
        with torch.no_grad():
            if new_engine or self.engine is None:
                self.engine = None
                self.engine = self.module.create_engine(config.to_dict(), str(weight_dir), self.device)
            outputs = []
            for call in calls:
                out = traces.replay(self.engine, call)
                outputs.append(out.detach().float().cpu().clone() if torch.is_tensor(out) else out)
        return outputs

    def retained_bytes(self) -> int:
        return retained_bytes(self.engine)


def check_traces(driver, references: References, config: ModelConfig, weight_dir, seed: int,
                 label: str, tally: Tally, full: bool = True, fresh: bool = True,
                 min_share: float = MIN_CHECKED_SHARE) -> None:
    """Every gate trace on one config, a fresh engine per trace as the evaluator does
    (`fresh`), or one engine through them all, one after another (each trace ends with
    every request removed); `full=False` keeps the cheap traces. `min_share`: of each
    trace's rows, those that must be left to check beside routing near-ties (a trace that
    leaves fewer is drawn again: `checkable_draw`)."""
    for i, (name, events) in enumerate(traces.gate_traces(seed, config.max_position_embeddings, full).items()):
        events, drawn, rules = checkable_draw(references, config, weight_dir, name, events, seed, full, min_share)
        outputs = driver.run_trace(config, weight_dir, events, drawn, new_engine=fresh or i == 0)
        check_outputs(outputs, references.trace(config, weight_dir, events, drawn), events,
                      f"{label}/{name}" + (f"@{drawn}" if drawn != seed else ""), tally, config.vocab_size,
                      references.allowance(config, weight_dir), rules)


def checkable_draw(references: References, config: ModelConfig, weight_dir, name: str, events, seed: int,
                   full: bool, min_share: float) -> tuple:
    """(events, token seed, row rules) of gate trace `name`: `events`, its draw at `seed`, or where
    under `min_share` of their rows could be checked beside routing near-ties, its draw at the
    first of REDRAWS other seeds that leaves enough. The references alone choose, so every
    candidate gets the same draw; TooFewRows (a ConfigError: the judge cannot judge) when none does."""
    drawn = seed
    for k in range(REDRAWS + 1):
        if k:
            drawn = seed + k * REDRAW_STRIDE
            events = traces.gate_traces(drawn, config.max_position_embeddings, full)[name]
        try:
            return events, drawn, references.row_rules(config, weight_dir, events, drawn, min_share)
        except TooFewRows as err:  # another ConfigError (weights, overflow) holds at every seed
            if k == REDRAWS:
                raise TooFewRows(f"{err}; so at {REDRAWS} more token seeds") from err


def check_churn(driver, references: References, config: ModelConfig, weight_dir, seed: int,
                label: str, tally: Tally, num_rounds: int = 4, min_share: float = MIN_CHECKED_SHARE) -> None:
    """Rounds of prefill, decode, remove with fresh ids on one engine: after the first
    round (which may allocate pools and tables), it must hold no more memory than then."""
    rng = random.Random(seed)
    baseline = None
    for r in range(num_rounds):
        events = traces.churn_round(rng)
        outputs = driver.run_trace(config, weight_dir, events, seed + r, new_engine=r == 0)
        check_outputs(outputs, references.trace(config, weight_dir, events, seed + r), events,
                      f"{label}/round{r}", tally, config.vocab_size, references.allowance(config, weight_dir),
                      references.row_rules(config, weight_dir, events, seed + r, min_share))
        held = driver.retained_bytes()
        baseline = held if baseline is None else baseline
        if held > baseline:
            raise CorrectnessError(f"{label}/round{r}: the engine holds {held} bytes after "
                                   f"removing every request, {baseline} after round 0: "
                                   "remove does not free state")


WRITING_WEIGHTS = threading.Lock()


def generated_weights(config: ModelConfig, scratch, std="unit", seed: int = DERIVED_WEIGHT_SEED) -> Path:
    """A weight dir for `config` (`std` as target.toy_weights takes it), made by this process
    before it first uses it, and again if a candidate changed it (fitness.weight_files: a
    file on disk may be an earlier candidate's). In the target's format: a Hugging Face
    family's as model.safetensors, under its names and in its RoPE row order, so that the
    engine reads them as it reads the target (where, on a mixture of experts in bf16, few
    rows can be checked: fitness/reference_logits.py)."""
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
    weight_dir = Path(scratch) / f"{digest}_{std}_{seed}{'_hf' if config.is_hf else ''}"
    path = weight_dir / (SAFETENSORS_FILE if config.is_hf else CONTRACT_FILE)
    with WRITING_WEIGHTS:  # a group's gates run in threads: one writes, the others find it written
        if not weight_files.TRUSTED.intact(weight_dir):
            wanted = generate_weights(config.to_dict(), seed, std)
            stored = to_hf_layout(wanted, config) if config.is_hf else wanted
            # Trusted only once read back equal under one fingerprint; rewritten only when not
            # equal (a run beside this one, sharing the scratch dir, keeps its file).
            for _ in range(3):
                if weight_files.holds(weight_dir, wanted, config):
                    break
                save_atomically(stored, path)
            else:
                raise weight_files.WeightsChanged(f"{path} does not keep what the judge writes")
    return weight_dir


def judging_weights(config: ModelConfig, scratch) -> Path:
    """Generated weights for a config the gate adds: unit-scaled, so structural faults show
    (fp16); the contract's own 0.02 init for bf16. In bf16 the reference's rounding of its
    probabilities and of every GEMM output is 8x coarser than fp16's, and unit-scaled
    weights amplify it: on an H200, reference-exact attention inside a program with fused
    QKV drew 1.0 to 2.0x the tolerance from one token draw to the next. Structural faults
    are the fp16 configs' job; bf16 checks the dtype under the evaluator's conditions."""
    std = PUBLIC_STD if config.compute_dtype("cuda") == torch.bfloat16 else "unit"
    return generated_weights(config, scratch, std)


LEVELS = ("screen", "full")


def correctness_plan(config: ModelConfig, weight_dir, scratch, level: str = "full") -> list:
    """(stage, label, config, weight dir, check, is_stress) for every config checked.

    "screen" is what every candidate goes through: every target trace, and the cheap ones
    on unit-scaled weights (where a rotate-half RoPE shows), one engine per config through
    its traces. "full" runs them on a fresh engine each, as the evaluator does, and adds
    the churn check and the derived configs: what a program needs to be kept or to win.
    The target's own weights may leave few rows to check (a mixture of experts in bf16 on a
    GPU routes by rounding at most of them); the gate's own, in the same config and format,
    route decisively, and there at least MIN_CHECKED_SHARE must be checked."""
    assert level in LEVELS, level
    fresh = level == "full"
    plan = [("target", "target", config, Path(weight_dir), partial(check_traces, fresh=fresh, min_share=0), False),
            ("target", "target_unit", config, judging_weights(config, scratch),
             partial(check_traces, full=False, fresh=fresh), True)]
    if level == "full":
        cheap = partial(check_traces, full=False)
        plan.insert(1, ("target", "churn", config, Path(weight_dir), partial(check_churn, min_share=0), False))
        for name, cfg in derived_configs(config).items():
            plan.append(("derived", name, cfg, judging_weights(cfg, scratch), cheap, True))
    return plan


def stage_limit(margin: float, is_stress: bool) -> float:
    """The fraction of the tolerance a stage must pass under: `margin` on the target's own
    weights, at least the evaluator's own limit on the stress configs."""
    return max(margin, STRESS_MARGIN) if is_stress else margin


def run_gate(driver, references: References, config: ModelConfig, weight_dir, seed: int, scratch,
             margin: float = DEFAULT_MARGIN, level: str = "full") -> GateResult:
    """Stages 2 and 3 through a driver (a runner process, or this process for `check`).
    A wrong answer is a failed GateResult; an exception from the candidate leaves as a
    GateFailure saying where, for the caller to tell a crash from a timeout."""
    stages, worst, worst_case, num_calls = {}, 0.0, "", 0
    for stage, label, cfg, wdir, check, is_stress in correctness_plan(config, weight_dir, scratch, level):
        limit = stage_limit(margin, is_stress)
        tally = Tally(limit)
        probe = partial(probe_fails, check, driver, references, seed, scratch, limit)
        try:
            check(driver, references, cfg, wdir, seed, label, tally)
            failure = None
        except CorrectnessError as err:
            failure = str(err) if label != FAMILIES else f"{failure_site(stage, label, cfg, err, probe)}: {err}"
        except JUDGES_OWN:
            raise
        except Exception as err:
            raise GateFailure(stage, label, failure_site(stage, label, cfg, err, probe), err) from err
        stages[label] = tally.worst
        num_calls += tally.num_calls
        if not tally.worst <= worst:
            worst, worst_case = tally.worst, tally.worst_case
        if failure:
            return GateResult(False, stage, label, failure, worst, worst_case, seed, num_calls, stages)
    return GateResult(True, "", "", "", worst, worst_case, seed, num_calls, stages)


def failure_site(stage: str, label: str, cfg: ModelConfig, err: Exception, probe) -> str:
    """"stage/label", and on the families config which features fail. Only a failing
    program pays for finding out; a runner that is gone can run nothing more."""
    site = f"{stage}/{label}"
    if label != FAMILIES or isinstance(err, RunnerFailure):
        return site
    try:
        return f"{site}: {failing_features(cfg, probe)}"
    except RunnerFailure as probe_err:
        return f"{site}: its runner failed while the features were tried alone ({probe_err.status})"


def failing_features(families: ModelConfig, probe) -> str:
    """Which family features a program fails on: each alone on the families config, after a
    control with all of them off (a failure there is not the features')."""
    off = {feature.field: feature.off for feature in FEATURES}
    if probe(families.derive(**off), f"{FAMILIES}/none"):
        return "fails with no family feature on too"
    failing = [f"{f.name} ({f.field})" for f in FEATURES
               if probe(families.derive(**{**off, f.field: getattr(families, f.field)}), f"{FAMILIES}/{f.field}")]
    return f"fails with {' and '.join(failing)}" if failing else "fails only with the features together"


def probe_fails(check, driver, references: References, seed: int, scratch, limit: float,
                cfg: ModelConfig, label: str) -> bool:
    """Whether `check` fails on `cfg`, its weights generated; the runner's failure propagates."""
    try:
        check(driver, references, cfg, judging_weights(cfg, scratch), seed, label, Tally(limit))
    except (RunnerFailure,) + JUDGES_OWN:
        raise
    except Exception:
        return True
    return False


def check_module(module, config: ModelConfig, weight_dir, device: str, seed: int, scratch,
                 margin: float = DEFAULT_MARGIN, derived: bool = True, references=None) -> GateResult:
    """The whole gate on an imported module, in this process (`python -m fitness check`);
    a GateFailure when the module raises. `references`: References kept across modules
    (a walk's children judged on one seed share their logits)."""
    references = References(device) if references is None else references
    references.model(config, weight_dir)  # missing or misshapen weights: a ConfigError now
    return run_gate(InProcessDriver(module, device), references, config, weight_dir, seed,
                    scratch, margin, "full" if derived else "screen")
