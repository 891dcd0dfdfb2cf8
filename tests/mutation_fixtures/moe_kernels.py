"""The MoE Triton alleles (route.triton_topk, moe.triton_grouped, plus_shared_expert.triton) against the seed's genes, on
CPU tensors through Triton's interpreter. Run in a fresh process with TRITON_INTERPRET=1 (the
test does); exits non-zero on the first mismatch and prints "ok NAME" for each check. fp32
and fp16, and bf16 where no dot runs (the pair kernels): the interpreter's bf16 dot is garbage
(tests/test_gpu.py checks bf16 compiled), and its casts to bf16 round as a GPU's only once
tests/triton_interpreter.py is installed."""
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 before importing triton"
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from mutations.alleles import load_module as load  # noqa: E402
from tests import triton_interpreter  # noqa: E402

triton_interpreter.install()  # the same interpreter, its per-launch cost cut

SEED = load("moe", "triton_grouped")  # the seed's genes under the allele's: route and sorted_experts are the seed's


def seed_moe(x, layer):
    return SEED.sorted_experts(x, *SEED.route(x, layer), layer)


def check(name, got, want, tol):
    err = (got.float() - want.float()).abs().max().item() if want.numel() else 0.0
    if got.shape != want.shape or err > tol:
        sys.exit(f"FAIL {name}: shape {tuple(got.shape)} / {tuple(want.shape)}, max error {err:.3g} > {tol:.3g}")
    print(f"ok {name} (max error {err:.2g})")


def sparse_layer(experts, top_k, hidden, inter, dtype, renormalise=True, favourite=None, seed=0):
    """Random weights; with `favourite`, a router that sends every token to that expert first."""
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(dtype)
    layer = {"router": draw(experts, hidden), "experts_gate": draw(experts, inter, hidden),
             "experts_up": draw(experts, inter, hidden), "experts_down": draw(experts, hidden, inter),
             "top_k": top_k, "renormalise": renormalise}
    if favourite is not None:
        layer["router"][favourite] = 0
        layer["router"][favourite, 0] = 50  # x[:, 0] > 0 below: this expert's logit leads every row
    return layer


def check_route(experts, top_k, rows, dtype, renormalise):
    module = load("route", "triton_topk")
    layer = sparse_layer(experts, top_k, 32, 8, dtype, renormalise)
    x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    weights, chosen = module.route(x, layer)
    want_weights, want_chosen = SEED.route(x, layer)
    name = f"route E={experts} k={top_k} N={rows} {dtype} renormalise={renormalise}"
    # compared in expert order: torch.topk may order equal logits either way
    chosen, order = chosen.sort(-1)
    want_chosen, want_order = want_chosen.sort(-1)
    if not torch.equal(chosen, want_chosen):
        sys.exit(f"FAIL {name}: experts {chosen.tolist()} against {want_chosen.tolist()}")
    check(name, weights.gather(1, order), want_weights.gather(1, want_order), tol=1e-6 if dtype == torch.float32 else 1e-3)


def check_route_ties():
    """Equal logits: the lower expert id first, as torch.topk gives them."""
    module = load("route", "triton_topk")
    layer = {"router": torch.zeros(6, 4), "top_k": 3, "renormalise": True}
    layer["router"][4, 0] = 1.0
    weights, chosen = module.route(torch.ones(2, 4), layer)
    if chosen.tolist() != [[4, 0, 1], [4, 0, 1]]:
        sys.exit(f"FAIL route ties: {chosen.tolist()}")
    check("route ties", weights.sum(-1), torch.ones(2), tol=1e-6)


def check_grouped(rows, dtype, experts=8, top_k=2, hidden=48, inter=40, favourite=None, blocks=16, tol=None,
                  one_by_one=2):
    """moe.triton_grouped against the seed's experts; up to `one_by_one` pairs, the pair kernels
    (their column blocks narrower than both widths: masked columns)."""
    module = load("moe", "triton_grouped")
    for bucket in ("FEW", "MANY", "SORTED"):  # narrower than the width: masked columns and inner tiles
        setattr(module, f"MOE_{bucket}_BLOCK_N", blocks)
        setattr(module, f"MOE_{bucket}_BLOCK_K", blocks)
    module.MOE_SORTED_BLOCK_M = 32
    module.MOE_FEW_PAIRS, module.MOE_HISTOGRAM_PAIRS = 8, 64  # every bucket's knobs in use below
    module.MOE_SUM_BLOCK = 32  # narrower than the width: masked column blocks
    module.MOE_PAIR_PAIRS, module.MOE_PAIR_BLOCK_N, module.MOE_PAIR_DOWN_BLOCK_N = one_by_one, 16, 32
    layer = sparse_layer(experts, top_k, hidden, inter, dtype, favourite=favourite)
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(2)).to(dtype)
    if favourite is not None:
        x[:, 0] = x[:, 0].abs() + 0.5
    calls = []
    for kernel in ("experts_gate_up_kernel", "pair_gate_up_kernel"):
        setattr(module, kernel, Counted(getattr(module, kernel), calls))
    got = module.moe(x, layer)
    want = seed_moe(x, layer)
    by_pair = rows * top_k <= one_by_one
    name = (f"grouped experts E={experts} k={top_k} N={rows} {dtype}{' one expert in every row' if favourite is not None else ''}"
            f"{' a pair at a time' if by_pair else ''}")
    if [c.kernel for c in calls] != [getattr(module, "pair_gate_up_kernel" if by_pair else "experts_gate_up_kernel").kernel]:
        sys.exit(f"FAIL {name}: the kernels ran {len(calls)} times")
    scale = want.abs().max().item() or 1.0
    check(name + (" sorted" if rows * top_k > module.MOE_HISTOGRAM_PAIRS else ""), got, want,
          tol=(tol or (1e-5 if dtype == torch.float32 else 4e-3)) * scale)


def check_shared(rows, dtype, hidden=48, width=40, launches=2):
    """plus_shared_expert.triton against the seed's shared expert: the two kernels (blocks of
    16, narrower than both widths: masked columns and inner tiles), or the seed's ops."""
    module = load("plus_shared_expert", "triton")
    module.GATED_BLOCK_N = module.GATED_BLOCK_K = 16
    module.SHARED_ROWS = 8
    gen = torch.Generator().manual_seed(3)

    def draw(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(dtype)
    layer = {"shared_gate": draw(width, hidden), "shared_up": draw(width, hidden), "shared_down": draw(hidden, width),
             "shared_expert_gate": draw(1, hidden)}
    x, out = draw(rows, hidden), draw(rows, hidden)
    calls = []
    for kernel in ("glu_kernel", "gated_down_kernel"):
        setattr(module, kernel, Counted(getattr(module, kernel), calls))
    got = module.plus_shared_expert(out, x, layer)
    want = SEED.plus_shared_expert(out, x, layer)
    name = f"shared expert N={rows} {dtype}"
    if len(calls) != launches:
        sys.exit(f"FAIL {name}: {len(calls)} launches, not {launches}")
    check(name, got, want, tol=0.0 if launches == 0 else 4e-3 * want.abs().max().item())
    if module.plus_shared_expert(out, x, {}) is not out:
        sys.exit("FAIL a layer without a shared expert: its output changed")


class Counted:
    """A kernel that notes each launch."""
    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        self.calls.append(self)
        return self.kernel[grid]


if __name__ == "__main__":
    SEED.__dict__["seed_route"] = load("moe", "triton_grouped").__dict__["route"]  # the seed's route
    SEED.__dict__["seed_moe"] = lambda x, layer: SEED.sorted_experts(x, *SEED.seed_route(x, layer), layer)
    for experts, top_k in ((8, 2), (128, 8), (6, 3)):
        for dtype in (torch.float32, torch.float16):
            check_route(experts, top_k, 5, dtype, renormalise=True)
        check_route(experts, top_k, 3, torch.float32, renormalise=False)
    check_route_ties()
    for rows in (1, 3, 8, 33):
        check_grouped(rows, torch.float32)
    check_grouped(5, torch.float16)
    check_grouped(40, torch.float32, favourite=3)  # 80 pairs, 40 of expert 3, sorted: two tiles of 32
    check_grouped(20, torch.float32, favourite=3)  # 40 pairs, 20 of expert 3, by rank: two tiles of 16
    check_grouped(2, torch.float32, experts=128, top_k=8, hidden=64, inter=32)
    check_grouped(1, torch.float32, experts=128, top_k=8, hidden=64, inter=40, one_by_one=8)  # a batch-1 step's 8 pairs
    check_grouped(1, torch.float16, experts=128, top_k=8, hidden=64, inter=40, one_by_one=8)
    check_grouped(1, torch.bfloat16, experts=128, top_k=8, hidden=64, inter=40, one_by_one=8)
    check_grouped(2, torch.float16, favourite=3, one_by_one=8)  # an expert with two pairs
    check_grouped(1, torch.float32, experts=128, top_k=8, hidden=64, inter=40, one_by_one=0)  # batch 1 by the tiles
    check_grouped(1, torch.float16, experts=128, top_k=8, hidden=64, inter=40, one_by_one=0)
    check_grouped(600, torch.float32)  # 1,200 pairs, sorted
    for rows in (1, 5, 8):
        check_shared(rows, torch.float16)
    check_shared(9, torch.float16, launches=0)  # past SHARED_ROWS: the seed's ops
    check_shared(3, torch.float32, launches=0)  # fp32: the seed's matmuls
