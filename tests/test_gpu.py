"""GPU-only paths, run on the GPU machine (`bash tools/gpu/queue.sh STATE 0 gpu_tests`; the
latest whole run: docs/log/2026-11-28-bf16-rope-through-kernels-exact.md); skipped cleanly on CPU."""
import json
import random

import pytest
import torch

import mutations
from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from fitness.gate import check_module
from fitness.runner import OutputCopies, output_checksum
from fitness.sandbox import judge
from mutations import recipe
from serve.engine_core import EngineCore
from serve.model_runner import ModelRunner, load_engine
from serve.sampling import SamplingParams
from serve.scheduler import Scheduler, SchedulerConfig
from target.toy_weights import ensure
from fitness.adversaries import planted
from tests.conftest import FASTEST, REPO, SEED_ENGINE
from tests.slot_states import Pools
from tests.test_hf import FAMILIES, make_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PUBLIC_CONFIG = REPO / "target" / "model_config.json"
PUBLIC_WEIGHTS = REPO / "target" / "weights"


def test_seed_engine_passes_the_gate_on_cuda_public_config(scratch):
    ensure(PUBLIC_CONFIG, PUBLIC_WEIGHTS)
    module = load_engine_module(SEED_ENGINE)
    result = check_module(module, ModelConfig.load(PUBLIC_CONFIG), PUBLIC_WEIGHTS, "cuda", 123, scratch)
    assert result.passed, result.error
    print(json.dumps(result.to_dict(), indent=1))


@pytest.mark.parametrize("fault", sorted(planted.FAULTS))
def test_planted_faults_are_rejected_on_cuda(fault, small_target, scratch, tmp_path):
    config_path, weight_dir = small_target
    module = load_engine_module(planted.write_faulty(fault, tmp_path))
    result = check_module(module, ModelConfig.load(config_path), weight_dir, "cuda", 7, scratch)
    assert not result.passed and result.stage == planted.FAULTS[fault]


def faulty_variant(tmp_path, name, old, new):
    path = tmp_path / f"{name}.py"
    path.write_text(planted.edit(SEED_ENGINE.read_text(), old, new))
    return path


def test_device_side_assert_is_a_crash_verdict(small_target, scratch, tmp_path):
    # An out-of-range embedding index: a device-side assert that poisons the CUDA context.
    path = faulty_variant(tmp_path, "oob", '        x = self.w["embed"][tokens]  # [N, hidden]',
                          '        x = self.w["embed"][tokens + 10**6]  # [N, hidden]')
    config_path, weight_dir = small_target
    verdict = judge(path, config_path, weight_dir, "cuda", timeout=120, bench="none", scratch=str(scratch))
    assert verdict["status"] == "crash", verdict


def test_the_outputs_checksum_on_the_device_is_the_hosts():
    """The runner sums outputs where they lie, the judge sums the copies it fetched."""
    outputs = [torch.randn(64, 3001).to(torch.bfloat16), torch.randn(40, 30).T, torch.arange(23, dtype=torch.uint8)[3:],
               torch.full((5,), -1.0, dtype=torch.float16)]
    assert output_checksum([t.cuda() for t in outputs]) == output_checksum(outputs) > 0


def test_the_runners_copies_on_the_device_sum_as_the_judge_does():
    """OutputCopies on a GPU: each output kept as it was when its call returned, one sum over
    the buffer equal to the judge's over the copies it fetched, run after run (one at an odd
    address, a transposed one, an element wider than a word); a staged run's held outputs
    summed joined."""
    copies, shared = OutputCopies(), torch.empty(300, 200, device="cuda")
    runs = [[torch.randn(300, 200), torch.randn(4, 7).to(torch.float16), None, torch.randn(40, 30).T],
            [torch.randn(700, 1000), torch.arange(23, dtype=torch.uint8)[3:], torch.randn(5, 3).to(torch.bfloat16),
             torch.randn(3, dtype=torch.complex128)]]
    for outputs in runs + runs[::-1]:
        copies.start("cuda")
        for out in outputs:
            copies.keep(shared.copy_(out) if torch.is_tensor(out) and out.shape == shared.shape else
                        out.cuda() if torch.is_tensor(out) else out)
        shared.fill_(7.0)
        assert copies.checksum() == output_checksum(outputs) == output_checksum([o.cpu() if torch.is_tensor(o) else o
                                                                                 for o in copies.outputs])
        assert all(torch.equal(kept.cpu(), out) if torch.is_tensor(out) else kept == out
                   for kept, out in zip(copies.outputs, outputs, strict=True))
    held = [torch.randn(8, 6000, device="cuda").half(), None, torch.randn(4, 7, device="cuda")]  # a staged run's
    copies.start("cuda")
    copies.hold(held)
    assert copies.checksum() == output_checksum([o.cpu() if torch.is_tensor(o) else o for o in held])


def test_staged_runs_on_a_gpu_hand_an_engine_tensors_of_their_own(small_target, scratch, tmp_path):
    """A staged run on a GPU (fitness/README.md): its inputs copied out of the mapped slot
    into device tensors of their own, its outputs held and summed joined. An engine wrong only
    on such tensors fails there; the seed beside itself is timed staged too."""
    from fitness.judge import Judge
    from tests.test_group_judging import differs_when_staged
    config_path, weight_dir = small_target
    wrong = tmp_path / "wrong_staged.py"
    wrong.write_text(differs_when_staged(SEED_ENGINE.read_text(), "            token_ids = torch.zeros_like(token_ids)\n"))
    judge_ = Judge("cuda", scratch=scratch)
    try:
        wronged, honest = judge_.judge_group([wrong, SEED_ENGINE], config_path, weight_dir, seed=3, level="none",
                                             bench="small", baseline=SEED_ENGINE, min_rounds=2, max_rounds=2,
                                             timeout=300, staged=True)
    finally:
        judge_.close()
    assert (wronged["status"], wronged["stage"]) == ("incorrect", "timed") and "/staged/" in wronged["error"], wronged
    assert honest["status"] == "ok" and 0.5 < honest["staged_ratio"] < 2.0, honest


def test_out_of_memory_is_a_crash_verdict(small_target, scratch, tmp_path):
    path = faulty_variant(tmp_path, "oom", "    return Engine(model_config, weight_dir, device)",
                          "    hog = torch.empty(2**44, dtype=torch.uint8, device=device)\n"
                          "    return Engine(model_config, weight_dir, device)")
    config_path, weight_dir = small_target
    verdict = judge(path, config_path, weight_dir, "cuda", timeout=120, bench="none", scratch=str(scratch))
    assert verdict["status"] == "crash" and "memory" in verdict["error"].lower(), verdict


@pytest.mark.parametrize("operator", ["allele.Engine.cuda_graphs", "allele.Engine.cuda_graphs_prefill"])
def test_graph_engines_alone_on_the_seed_pass_the_gate(operator, scratch, tmp_path):
    """Each graph engine swapped into the seed alone: q, k, v from three projections, whose
    tensors the CUDA allocator can place end to end (a search's first sweep once crashed
    on that, at batch 1, where the CPU tests could not see it)."""

    ensure(PUBLIC_CONFIG, PUBLIC_WEIGHTS)
    path = tmp_path / "child.py"
    path.write_text(mutations.get_operator(operator).apply(SEED_ENGINE.read_text(), random.Random(0)).source)
    result = check_module(load_engine_module(path), ModelConfig.load(PUBLIC_CONFIG), PUBLIC_WEIGHTS, "cuda", 123,
                          scratch)
    assert result.passed, result.error


@pytest.mark.parametrize("operator", ["programmatic_launch", "prefetched_linears"])
def test_the_recipe_under_programmatic_launch_passes_the_gate(operator, scratch, tmp_path):
    """fastest.txt's program short of its last line (prefetched_linears, which brings
    programmatic_launch with it), with every Triton kernel under programmatic dependent
    launch, inside its CUDA graphs (on a GPU before Hopper the flag is off: the plain
    program), or with its small matmuls in the prefetching kernel too."""
    ensure(PUBLIC_CONFIG, PUBLIC_WEIGHTS)
    steps = recipe.parse(FASTEST.read_text())
    assert steps[-1].operator == "prefetched_linears", steps[-1]
    source = recipe.apply(steps[:-1])
    path = tmp_path / "child.py"
    path.write_text(mutations.get_operator(operator).apply(source, random.Random(0)).source)
    module = load_engine_module(path)
    assert module.PDL_LAUNCH == (torch.cuda.get_device_capability()[0] >= 9)
    result = check_module(module, ModelConfig.load(PUBLIC_CONFIG), PUBLIC_WEIGHTS, "cuda", 123, scratch)
    assert result.passed, result.error


@pytest.mark.parametrize("family", FAMILIES)
def test_the_recipe_keeps_its_kernels_on_a_bf16_hugging_face_checkpoint(family, scratch, tmp_path):
    """On a Hugging Face checkpoint in bf16 the recipe's attention runs its Triton kernels
    (the contract's bf16 rounding is not asked there: its gate is fp32, calibrated), and
    passes that gate, with the family's features and the derived configs."""
    folder = make_checkpoint(tmp_path / family, family, torch.bfloat16)
    path = tmp_path / "recipe.py"
    path.write_text(recipe.apply(recipe.parse(FASTEST.read_text())))
    module = load_engine_module(path)
    engine = module.create_engine(json.loads((folder / "config.json").read_text()), str(folder), "cuda")
    assert engine.dtype == torch.bfloat16 and not engine.cache.reference_rounding
    assert engine.rope_cos.dtype == torch.float32  # so the RoPE kernel runs, not the reference's ops
    assert engine.buckets["prefill"], "bf16 prefills of a checkpoint are captured"
    del engine
    result = check_module(module, ModelConfig.load(folder), folder, "cuda", 123, scratch)
    assert result.passed, result.error


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_5"])
def test_the_moe_recipes_pass_the_gate_on_a_bf16_checkpoint(name, scratch, tmp_path):
    """The hand-composed MoE programs (qwen3_moe_by_hand.txt: at one row the norm folded into the
    router's projection, every kernel under PDL; qwen3_5_by_hand.txt: the hybrid's; both take
    the experts a pair at a time at batch 1) pass the gate on their family's tiny bf16 checkpoint."""
    from target import hf_checkpoints
    from tests import test_moe
    # The hybrid's checkpoint is target.hf_checkpoints' (the GPU scripts' own): on tests/test_hybrid's,
    # the gate's derived config finds no row clear of a routing near-tie under bf16 and refuses to judge.
    folder = (test_moe.make_checkpoint(tmp_path / "model", torch.bfloat16) if name == "qwen3_moe"
              else hf_checkpoints.write(tmp_path, "tiny_qwen3_5_moe"))
    path = tmp_path / "program.py"
    path.write_text(recipe.apply(recipe.parse((REPO / "mutations" / "recipes" / f"{name}_by_hand.txt").read_text())))
    result = check_module(load_engine_module(path), ModelConfig.load(folder), folder, "cuda", 123, scratch)
    assert result.passed, result.error


@pytest.mark.parametrize("one_row_share", [1024, 16384])  # shares summed by a second kernel; one share
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_prefetched_linear_matches_fp32_on_the_real_shapes(dtype, one_row_share):
    """The prefetched_linears helper compiled for a GPU (the interpreter neither compiles nor
    rounds as a GPU does): one row and eight, the Llama-3.2-1B and Qwen3-0.6B projections, one
    row's shares summed by the second kernel or taken whole in fewer columns a program."""
    from mutations.rewrites.kernels import prefetched_linear as linear
    saved = linear.PREFETCH_ONE_ROW_SHARE, linear.PREFETCH_WEIGHT
    linear.PREFETCH_ONE_ROW_SHARE, linear.PREFETCH_WEIGHT = one_row_share, 10485760
    try:
        torch.manual_seed(0)
        for out, inner in ((3072, 2048), (2048, 8192), (4096, 1024), (1024, 3072), (151936, 1024)):
            weight = torch.randn(out, inner, device="cuda", dtype=dtype) * 0.02
            for rows in (1, 8):
                x = torch.randn(rows, inner, device="cuda", dtype=dtype)
                want = x.float() @ weight.float().T
                got = linear.prefetched_linear(x, weight).float()
                error = ((got - want).norm() / want.norm()).item()
                assert error < 8e-3, (out, inner, rows, error)  # bf16 rounds to 8 bits
    finally:
        linear.PREFETCH_ONE_ROW_SHARE, linear.PREFETCH_WEIGHT = saved


@pytest.mark.parametrize("width", [3072, 8192])  # Qwen3-0.6B's intermediate, Llama-3.2-1B's
def test_the_swiglu_folded_into_down_matches_fp32_on_the_real_shapes(width):
    """mlp.swiglu_triton's one-row fold compiled for a GPU: one bf16 row's product and down
    projection in one kernel (the product's own kernel unlaunchable) against fp32."""
    from mutations.alleles import load_module as load_allele
    module = load_allele("mlp", "swiglu_triton")
    module.swiglu.__globals__.update(FOLD_WIDTH=16384, swiglu_kernel=None)  # shared.py's, which swiglu reads
    torch.manual_seed(0)
    hidden = 2048
    gate_up = torch.randn(2 * width, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    down = torch.randn(hidden, width, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    gate, up = (x.float() @ gate_up.float().T).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ down.float().T
    got = module.mlp(x, {"gate_up": gate_up, "down": down}).float()
    error = ((got - want).norm() / want.norm()).item()
    assert error < 8e-3, error  # bf16 rounds to 8 bits


@pytest.mark.parametrize("rows", [2, 8, 64])
@pytest.mark.parametrize("width", [3072, 8192])
def test_the_glu_matmul_matches_fp32_on_the_real_shapes(width, rows):
    """mlp.glu_matmul compiled for a GPU: a few bf16 rows' gate/up product with SwiGLU in its
    epilogue (the SwiGLU kernel unlaunchable) against fp32."""
    from mutations.alleles import load_module as load_allele
    module = load_allele("mlp", "glu_matmul")
    module.swiglu.__globals__["swiglu_kernel"] = None
    torch.manual_seed(0)
    hidden = 2048
    gate_up = torch.randn(2 * width, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    down = torch.randn(hidden, width, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    gate, up = (x.float() @ gate_up.float().T).chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate) * up) @ down.float().T
    got = module.mlp(x, {"gate_up": gate_up, "down": down}).float()
    error = ((got - want).norm() / want.norm()).item()
    assert error < 8e-3, error  # bf16 rounds to 8 bits


@pytest.mark.parametrize("rows", [1, 8, 64, 200])
def test_the_moe_triton_alleles_match_fp32_on_qwen3_30b_a3b_layer(rows):
    """route.triton_topk and moe.triton_grouped compiled for a GPU, bf16 on Qwen3-30B-A3B's layer
    (128 experts of 768, top 8, hidden 2048): the same experts as the seed's route, the layer's
    output against fp32 math over those experts; and a captured CUDA graph of the layer
    replayed on other rows gives what an eager call does (no value read back to the host;
    200 rows: 1,600 pairs, sorted first)."""
    from mutations.alleles import load_module as load_allele
    module = load_allele("moe", "triton_grouped")
    seed_route, module.route = module.route, load_allele("route", "triton_topk").route
    torch.manual_seed(0)
    experts, inter, hidden = 128, 768, 2048
    layer = {"router": torch.randn(experts, hidden, device="cuda", dtype=torch.bfloat16) / hidden ** 0.5,
             "top_k": 8, "renormalise": True}
    for name, shape in (("experts_gate", (inter, hidden)), ("experts_up", (inter, hidden)), ("experts_down", (hidden, inter))):
        layer[name] = torch.randn(experts, *shape, device="cuda", dtype=torch.bfloat16) / shape[1] ** 0.5
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    weights, chosen = module.route(x, layer)
    want_weights, want_chosen = seed_route(x, layer)
    assert torch.equal(chosen.sort(-1).values, want_chosen.sort(-1).values)
    f = {name: t.float() for name, t in layer.items() if torch.is_tensor(t)}
    want = torch.zeros(rows, hidden, device="cuda")
    for t in range(rows):
        for j in range(8):
            e, row = chosen[t, j], x[t].float()
            product = torch.nn.functional.silu(f["experts_gate"][e] @ row) * (f["experts_up"][e] @ row)
            want[t] += weights[t, j].float() * (f["experts_down"][e] @ product)
    got = module.moe(x, layer).float()
    assert ((got - want).norm() / want.norm()).item() < 8e-3  # bf16 rounds to 8 bits
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    module.moe(static, layer)  # compiled before the capture
    with torch.cuda.graph(graph):
        captured = module.moe(static, layer)
    static.copy_(torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16))
    graph.replay()
    assert torch.equal(captured, module.moe(static, layer))


@pytest.mark.parametrize("rows", [1, 8, 64])
def test_the_shared_expert_kernels_round_as_the_seeds_ops_on_qwen3_5_layer(rows):
    """plus_shared_expert.triton compiled for a GPU, bf16 on Qwen3.5-35B-A3B's shared expert
    (512 wide, hidden 2048): against the seed's torch ops (each output within one bf16 step of
    theirs: the dots sum in another order) and against fp32 math; a captured graph replays it."""
    from mutations.alleles import load_module as load_allele
    module = load_allele("plus_shared_expert", "triton")
    torch.manual_seed(0)
    width, hidden = 512, 2048
    layer = {name: torch.randn(*shape, device="cuda", dtype=torch.bfloat16) / shape[1] ** 0.5
             for name, shape in (("shared_gate", (width, hidden)), ("shared_up", (width, hidden)),
                                 ("shared_down", (hidden, width)), ("shared_expert_gate", (1, hidden)))}
    x, out = (torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    got, seed = module.plus_shared_expert(out, x, layer), load_engine_module(SEED_ENGINE).plus_shared_expert(out, x, layer)
    step = seed.float().abs().clamp(min=2 ** -126) * 2 ** -7  # one bf16 step at each output's size
    assert ((got.float() - seed.float()).abs() <= step).float().mean().item() > 0.99
    f = {name: t.float() for name, t in layer.items()}
    xf = x.float()
    shared = (torch.nn.functional.silu(xf @ f["shared_gate"].T) * (xf @ f["shared_up"].T)) @ f["shared_down"].T
    want = out.float() + torch.sigmoid(xf @ f["shared_expert_gate"].T) * shared
    assert ((got.float() - want).norm() / want.norm()).item() < 8e-3
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = module.plus_shared_expert(out, static, layer)
    static.copy_(torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16))
    graph.replay()
    assert torch.equal(captured, module.plus_shared_expert(out, static, layer))


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_the_fused_delta_net_decode_matches_the_seeds_on_qwen3_5_layer(rows):
    """delta_net_decode.triton_fused against the seed's, bf16, Qwen3.5-35B-A3B's DeltaNet (16
    key and 32 value heads of 128, conv kernel 4), requests in scattered slots, three steps:
    outputs and both states, carried in place; and in a captured graph replayed on new
    rows, what an eager call gives."""
    from mutations.alleles import load_module as load_allele
    fused = load_allele("delta_net_decode", "triton_fused").delta_net_decode
    seed = load_engine_module(SEED_ENGINE)
    torch.manual_seed(0)
    lin = {"key_heads": 16, "value_heads": 32, "key_dim": 128, "value_dim": 128,
           "conv": torch.randn(8192, 1, 4, device="cuda", dtype=torch.bfloat16) / 2}
    conv = torch.randn(80, 8192, 3, device="cuda", dtype=torch.bfloat16)
    matrix = torch.randn(80, 32, 128, 128, device="cuda") / 8
    theirs = Pools(conv, matrix)
    ours = theirs.copy()
    step = seed.Step([], [], [], None, True, state_slots=torch.randperm(79, device="cuda")[:rows] + 1)
    for _ in range(3):
        mixed = torch.randn(rows, 8192, device="cuda", dtype=torch.bfloat16)
        log_decay = -torch.rand(rows, 32, device="cuda")
        beta = torch.rand(rows, 32, device="cuda")
        got = fused(mixed, log_decay, beta, lin, ours, step, 0)
        want = seed.delta_net_decode(mixed, log_decay, beta, lin, theirs, step, 0)
        assert ((got - want).norm() / want.norm()).item() < 4e-3  # a conv output in bf16 may round apart
        assert ((ours.matrix[0] - theirs.matrix[0]).norm() / theirs.matrix[0].norm()).item() < 4e-3
        assert torch.equal(ours.conv[0], theirs.conv[0])  # the inputs, shifted: no arithmetic
    static = [mixed.clone(), log_decay.clone(), beta.clone()]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fused(*static, lin, ours, step, 0)
    before = ours.copy()
    static[0].copy_(torch.randn_like(static[0]))
    static[1].copy_(-torch.rand_like(static[1]))
    static[2].copy_(torch.rand_like(static[2]))
    graph.replay()
    assert torch.equal(captured, fused(*static, lin, before, step, 0))
    assert torch.equal(ours.matrix[0], before.matrix[0]) and torch.equal(ours.conv[0], before.conv[0])


def test_the_chunked_delta_net_prefill_matches_the_seeds_on_qwen3_5_layer():
    """delta_net_prefill.triton_chunked against the seed's on Qwen3.5-35B-A3B's DeltaNet,
    prompts of 1,024, 300 and 1 tokens at once: outputs and the states it leaves (a bf16
    engine's: the kernel's products in tf32, 10 bits of mantissa)."""
    from mutations.alleles import load_module as load_allele
    chunked = load_allele("delta_net_prefill", "triton_chunked").delta_net_prefill
    seed = load_engine_module(SEED_ENGINE)
    torch.manual_seed(0)
    lin = {"key_heads": 16, "value_heads": 32, "key_dim": 128, "value_dim": 128,
           "conv": torch.randn(8192, 1, 4, device="cuda", dtype=torch.bfloat16) / 2}
    lengths = [1024, 300, 1]
    pools = [Pools(torch.zeros(4, 8192, 3, device="cuda", dtype=torch.bfloat16),
                   torch.zeros(4, 32, 128, 128, device="cuda")) for _ in range(2)]
    step = seed.Step([0, 1, 2], [0, 0, 0], lengths, None, False, state_slots=torch.tensor([3, 1, 2], device="cuda"))
    mixed = torch.randn(sum(lengths), 8192, device="cuda", dtype=torch.bfloat16)
    log_decay = -torch.rand(sum(lengths), 32, device="cuda") / 4
    beta = torch.rand(sum(lengths), 32, device="cuda")
    want = seed.delta_net_prefill(mixed, log_decay, beta, lin, pools[0], step, 0)
    got = chunked(mixed, log_decay, beta, lin, pools[1], step, 0)
    assert ((got - want).norm() / want.norm()).item() < 3e-3
    assert ((pools[1].matrix[0] - pools[0].matrix[0]).norm() / pools[0].matrix[0].norm()).item() < 3e-3
    assert torch.equal(pools[1].conv[0], pools[0].conv[0])


@pytest.mark.parametrize("rows_from_memory", [0, 1])
def test_the_delta_net_prefill_with_triton_systems_and_convs_matches_the_seeds(rows_from_memory):
    """delta_net_prefill.triton_chunked with chunk_systems.triton (the solves by forward
    substitution, A's rows from the registers or from a scratch, tf32x3 products) and
    prompt_convs.triton in it, against the seed's prefill on Qwen3.5-35B-A3B's DeltaNet, bf16,
    prompts of 1,024, 300, 3 and 1 tokens at once: outputs, the states left, the conv states
    (the inputs: exactly)."""
    from mutations.alleles import load_module as load_allele
    chunked = load_allele("delta_net_prefill", "triton_chunked")
    systems = load_allele("chunk_systems", "triton")
    systems.SYSTEM_ROWS_FROM_MEMORY = rows_from_memory
    chunked.chunk_systems = systems.chunk_systems
    chunked.prompt_convs = load_allele("prompt_convs", "triton").prompt_convs
    seed = load_engine_module(SEED_ENGINE)
    torch.manual_seed(0)
    lin = {"key_heads": 16, "value_heads": 32, "key_dim": 128, "value_dim": 128,
           "conv": torch.randn(8192, 1, 4, device="cuda", dtype=torch.bfloat16) / 2}
    lengths = [1024, 300, 3, 1]
    pools = [Pools(torch.zeros(5, 8192, 3, device="cuda", dtype=torch.bfloat16),
                   torch.zeros(5, 32, 128, 128, device="cuda")) for _ in range(2)]
    step = seed.Step([0, 1, 2, 3], [0] * 4, lengths, None, False, state_slots=torch.tensor([3, 1, 2, 4], device="cuda"))
    mixed = torch.randn(sum(lengths), 8192, device="cuda", dtype=torch.bfloat16)
    log_decay = -torch.rand(sum(lengths), 32, device="cuda") / 4
    beta = torch.rand(sum(lengths), 32, device="cuda")
    want = seed.delta_net_prefill(mixed, log_decay, beta, lin, pools[0], step, 0)
    got = chunked.delta_net_prefill(mixed, log_decay, beta, lin, pools[1], step, 0)
    assert ((got - want).norm() / want.norm()).item() < 3e-3  # a conv output in bf16 may round apart
    assert ((pools[1].matrix[0] - pools[0].matrix[0]).norm() / pools[0].matrix[0].norm()).item() < 3e-3
    assert torch.equal(pools[1].conv[0], pools[0].conv[0])


@pytest.mark.parametrize("rows", [1, 64, 300])
def test_the_delta_net_gate_and_norm_kernels_match_the_seeds_on_qwen3_5_layer(rows):
    """delta_gates.triton and gated_rms_norm.triton against the seed's, bf16, Qwen3.5's width
    (hidden 2048, 32 value heads of 128): the decay and beta, the gated output."""
    from mutations.alleles import load_module as load_allele
    gates = load_allele("delta_gates", "triton").delta_gates
    norm = load_allele("gated_rms_norm", "triton").gated_rms_norm
    seed = load_engine_module(SEED_ENGINE)
    torch.manual_seed(0)
    lin = {"a": torch.randn(32, 2048, device="cuda", dtype=torch.bfloat16) / 45,
           "b": torch.randn(32, 2048, device="cuda", dtype=torch.bfloat16) / 45,
           "A_log": torch.randn(32, device="cuda"), "dt_bias": torch.randn(32, device="cuda")}
    x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16)
    for got, want in zip(gates(x, lin), seed.delta_gates(x, lin)):
        assert ((got - want).norm() / want.norm()).item() < 1e-2  # a dot product rounded to bf16 may land apart
    out = torch.randn(rows, 32, 128, device="cuda")
    z = torch.randn(rows, 32, 128, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(128, device="cuda", dtype=torch.bfloat16) + 0.5
    got, want = norm(out, z, weight, 1e-6), seed.gated_rms_norm(out, z, weight, 1e-6)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 4e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 192), (32, 8, 64), (16, 8, 128)])
def test_the_rope_kernels_round_as_torch_does_on_the_real_shapes(heads, kv_heads, head_dim, dtype):
    """The RoPE kernels compiled for a GPU, tables in the compute dtype (the contract's bf16):
    bit for bit torch's ops, each product rounded before the sum. Unless each product is
    mul_rn, ptxas fuses it into the 16-bit add and 1 in 5 bf16 outputs differ (the
    interpreter rounds neither way as the GPU does, so only a GPU can tell)."""
    from types import SimpleNamespace

    from mutations.alleles import load_module as load_allele
    seed_rope = load_engine_module(SEED_ENGINE).apply_rope  # the reference's ops
    torch.manual_seed(0)
    tokens = 300
    q, k, v = (torch.randn(tokens, n, head_dim, device="cuda").mul(3).to(dtype) for n in (heads, kv_heads, kv_heads))
    positions = torch.arange(tokens, device="cuda", dtype=torch.float32) + 7
    angles = torch.outer(positions, 10000.0 ** -(torch.arange(0, head_dim, 2, device="cuda") / head_dim))
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    want_q, want_k = seed_rope(q, cos, sin), seed_rope(k, cos, sin)
    for name, kernel in (("triton", "rope_kernel"), ("triton_rows", "rope_rows_kernel")):
        module = load_allele("apply_rope", name)
        assert torch.equal(module.launch_rope(getattr(module, kernel), q, cos, sin), want_q), name
    inputs = load_allele("attention_inputs", "triton")
    written = []
    cache = SimpleNamespace(write=lambda index, step, k, v: written.append(k))
    got_q, got_k = inputs.attention_inputs(q.clone(), k.clone(), v, {}, cos, sin, cache, None, 0, 1e-6)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k) and written[0] is got_k


@pytest.mark.parametrize("engine", ["seed", "recipe"])
def test_the_servers_steps_launched_ahead_give_the_engines_own_greedy_tokens(engine, small_target, tmp_path):
    """The serving loop feeds each decode the last step's tokens on the device (pinned
    copies up, the tokens' copy down behind an event) and reads a step back only after the
    next is launched: the tokens must be the ones the same engine gives in the same
    batches driven one call at a time."""
    config_path, weight_dir = small_target
    device = "cuda"
    path = SEED_ENGINE
    if engine == "recipe":
        path = tmp_path / "recipe.py"
        path.write_text(recipe.apply(recipe.parse(FASTEST.read_text())))
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (5, 17, 40)]
    steps = 12

    direct = load_engine(path, config_path, weight_dir, device)
    ids = [1000, 1001, 1002]
    with torch.inference_mode():
        tokens = direct.prefill(ids, [torch.tensor(p, device=device) for p in prompts]).argmax(-1)
        expected = [tokens.tolist()]
        for _ in range(steps - 1):
            tokens = direct.decode(ids, tokens).argmax(-1)
            expected.append(tokens.tolist())
    expected = [list(column) for column in zip(*expected)]  # per prompt

    runner = ModelRunner(load_engine(path, config_path, weight_dir, device), device)
    core = EngineCore(runner, Scheduler(SchedulerConfig()), eos_token_id=None)
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    seqs = core.add([(2000 + i, prompt, params) for i, prompt in enumerate(prompts)])
    while core.has_work():
        core.step()
    assert [s.output_token_ids for s in seqs] == expected


def test_the_timed_run_overhead_timeline_counts_every_call_of_a_case(capsys, tmp_path):
    """tools.timed_run_overhead --timeline on the seed: each in-process variant's marked run
    counts every call of the public decode case, and --timeline-json holds each one (its
    arithmetic: tests/test_timed_run_overhead.py)."""
    from fitness.cases import select_cases
    from tools import timed_run_overhead
    ensure(PUBLIC_CONFIG, PUBLIC_WEIGHTS)
    calls = len(select_cases("public")["decode"])
    timed_run_overhead.main(["--engine", str(SEED_ENGINE), "--model-config", str(PUBLIC_CONFIG), "--weight-dir",
                             str(PUBLIC_WEIGHTS), "--cases", "public", "--rounds", "1", "--variants", "bench", "go",
                             "--timeline", "--timeline-json", str(tmp_path / "calls.json")])
    lines = [line for line in capsys.readouterr().out.splitlines() if " timeline: " in line]
    assert len(lines) == 2 * len(select_cases("public")), lines
    assert sum(f"timeline: {calls} calls; device inside " in line for line in lines) == 2, lines
    decode = json.loads((tmp_path / "calls.json").read_text())["decode"]
    assert sorted(decode) == ["bench", "go"] and all(len(rows) == calls for rows in decode.values())
