"""The Gated DeltaNet's Triton alleles (delta_net_decode.triton_fused,
delta_net_prefill.triton_chunked, delta_gates.triton, gated_rms_norm.triton,
chunk_systems.triton, prompt_convs.triton) against the
seed's genes, fp32 (and fp16 for the last two) on CPU tensors through Triton's interpreter.
Run in a fresh process with TRITON_INTERPRET=1 (the test does); exits non-zero on the first
mismatch and prints "ok NAME" for each check."""
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 before importing triton"
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from contract.loader import SEED_ENGINE, load_engine_module  # noqa: E402
from mutations.alleles import load_module as load  # noqa: E402
from tests.slot_states import Pools  # noqa: E402
from tests import triton_interpreter  # noqa: E402

triton_interpreter.install()  # the same interpreter, its per-launch cost cut

SEED = load_engine_module(SEED_ENGINE)

DECODE = load("delta_net_decode", "triton_fused")  # the seed's genes under the allele's
PREFILL = load("delta_net_prefill", "triton_chunked")
GATES = load("delta_gates", "triton")
NORM = load("gated_rms_norm", "triton")
SYSTEMS = load("chunk_systems", "triton")
CONVS = load("prompt_convs", "triton")


def check(name, got, want, tol=1e-4):
    err = ((got - want).abs().max() / want.abs().max().clamp(min=1e-6)).item() if want.numel() else 0.0
    if got.shape != want.shape or err > tol:
        sys.exit(f"FAIL {name}: shape {tuple(got.shape)} / {tuple(want.shape)}, relative error {err:.3g} > {tol:.3g}")
    print(f"ok {name} (relative error {err:.2g})")


def check_step(name, got, want, ours, theirs):
    """Outputs, delta-rule states and conv states (the inputs shifted: exactly) alike."""
    check(f"{name}: outputs", got, want)
    check(f"{name}: states", ours.matrix[0], theirs.matrix[0])
    check(f"{name}: conv states", ours.conv[0], theirs.conv[0], tol=0)


def linear(key_heads, value_heads, key_dim, value_dim, kernel=4):
    channels = 2 * key_heads * key_dim + value_heads * value_dim
    return {"key_heads": key_heads, "value_heads": value_heads, "key_dim": key_dim, "value_dim": value_dim,
            "conv": torch.randn(channels, 1, kernel) / 2}, channels


def inputs(rows, lin, channels):
    return (torch.randn(rows, channels), -torch.rand(rows, lin["value_heads"]), torch.rand(rows, lin["value_heads"]))


torch.manual_seed(0)
for dims in ((2, 4, 16, 16), (1, 2, 8, 8), (2, 4, 16, 32)):  # key heads, value heads, key dim, value dim
    lin, channels = linear(*dims)
    slots = 9
    theirs = Pools(torch.randn(slots, channels, 3), torch.randn(slots, dims[1], dims[2], dims[3]) / 4)
    ours = theirs.copy()
    for lengths in ([70, 4, 130], [64], [1, 65]):  # chunks of 64: two, one, three; exactly one; a lone token
        step = SEED.Step(list(range(len(lengths))), [0] * len(lengths), lengths, None, False,
                         state_slots=torch.randperm(slots - 1)[:len(lengths)] + 1)
        mixed, log_decay, beta = inputs(sum(lengths), lin, channels)
        want = SEED.delta_net_prefill(mixed, log_decay, beta, lin, theirs, step, 0)
        got = PREFILL.delta_net_prefill(mixed, log_decay, beta, lin, ours, step, 0)
        check_step(f"prefill {dims} {lengths}", got, want, ours, theirs)
        step.is_decode, step.num_new = True, [1] * len(lengths)
        for i in range(3):
            mixed, log_decay, beta = inputs(len(lengths), lin, channels)
            want = SEED.delta_net_decode(mixed, log_decay, beta, lin, theirs, step, 0)
            got = DECODE.delta_net_decode(mixed, log_decay, beta, lin, ours, step, 0)
            check_step(f"decode {dims} {lengths} step {i}", got, want, ours, theirs)

for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):  # fp16: one rounding may land apart
    for rows, hidden, heads in ((1, 64, 4), (5, 300, 32), (0, 64, 4)):
        lin = {"a": (torch.randn(heads, hidden) / hidden ** 0.5).to(dtype),
               "b": (torch.randn(heads, hidden) / hidden ** 0.5).to(dtype),
               "A_log": torch.randn(heads), "dt_bias": torch.randn(heads) * 8}  # some past softplus' threshold
        x = torch.randn(rows, hidden).to(dtype)
        for GATES.DELTA_GATES_HEADS, GATES.DELTA_GATES_BLOCK in ((2, 2048), (32, 64)):  # the row in one step; in many
            got, want = GATES.delta_gates(x, lin), SEED.delta_gates(x, lin)
            for name, g, w in zip(("log_decay", "beta"), got, want):
                check(f"delta_gates {dtype} {rows}x{hidden}, {heads} heads, {GATES.DELTA_GATES_HEADS} a program, "
                      f"{GATES.DELTA_GATES_BLOCK} a step: {name}", g, w, tol)
        out = torch.randn(rows, heads, 16) * 3
        z = torch.randn(rows, heads, 16).to(dtype)
        weight = (1 + torch.randn(16) / 4).to(dtype)
        check(f"gated_rms_norm {dtype} {rows}x{heads}x16", NORM.gated_rms_norm(out, z, weight, 1e-6),
              SEED.gated_rms_norm(out, z, weight, 1e-6), tol)

for rows_from_memory in (0, 1):  # the substitution's rows of A from the registers, from a scratch
    SYSTEMS.SYSTEM_ROWS_FROM_MEMORY = rows_from_memory
    for heads, chunks, key_dim, value_dim in ((2, 3, 16, 16), (1, 2, 8, 8), (2, 2, 32, 16)):
        q, k = (torch.nn.functional.normalize(torch.randn(heads, chunks, 64, key_dim), dim=-1) for _ in range(2))
        v = torch.randn(heads, chunks, 64, value_dim)
        log_decay, beta = -torch.rand(heads, chunks, 64) / 4, torch.rand(heads, chunks, 64)
        log_decay[:, -1, 40:], beta[:, -1, 40:] = 0, 0  # a prompt's padding, as the prefill pads
        got, want = SYSTEMS.chunk_systems(q, k, v, log_decay, beta), SEED.chunk_systems(q, k, v, log_decay, beta)
        for name, g, w in zip(("u", "w", "decay", "attention"), got, want):
            check(f"chunk_systems.triton rows {rows_from_memory} {heads}x{chunks}x{key_dim}x{value_dim}: {name}",
                  g, w, 1e-5)

    # Keys alike, writes strong, little decay: the inverse's entries far from 1. Against the
    # seed in fp64, as close as the seed's own fp32 solves (1e-6 of the largest entry here).
    base = torch.randn(32)
    k = torch.nn.functional.normalize(base + 0.3 * torch.randn(2, 2, 64, 32), dim=-1)
    q, v = torch.nn.functional.normalize(torch.randn(2, 2, 64, 32), dim=-1), torch.randn(2, 2, 64, 32)
    log_decay, beta = -torch.rand(2, 2, 64) / 100, 0.9 + 0.1 * torch.rand(2, 2, 64)
    exact = SEED.chunk_systems(*(t.double() for t in (q, k, v, log_decay, beta)))
    for name, g, w in zip(("u", "w", "decay", "attention"), SYSTEMS.chunk_systems(q, k, v, log_decay, beta), exact):
        check(f"chunk_systems.triton rows {rows_from_memory}, keys alike, against fp64: {name}", g.double(), w, 1e-5)
SYSTEMS.SYSTEM_ROWS_FROM_MEMORY = 0

for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):  # bf16: one rounding may land apart
    for lengths, channels in (([70, 4, 130], 200), ([1], 64), ([2, 3, 1, 40], 130)):
        step = SEED.Step(list(range(len(lengths))), [0] * len(lengths), lengths, None, False)
        lin = {"conv": (torch.randn(channels, 1, 4) / 2).to(dtype)}
        mixed = torch.randn(sum(lengths), channels).to(dtype)
        out, states = CONVS.prompt_convs(mixed, lin, step)
        want_out, want_states = SEED.prompt_convs(mixed, lin, step)
        check(f"prompt_convs {dtype} {lengths}: outputs", out.float(), want_out.float(), tol)
        check(f"prompt_convs {dtype} {lengths}: states", states.float(), want_states.float(), tol=0)
