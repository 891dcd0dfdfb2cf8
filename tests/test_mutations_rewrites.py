"""Before/after source for each structural rewrite, and the case where it declines
(LibCST's CodemodTest, in plain pytest)."""
import random
import textwrap

import torch

import mutations
from mutations import program

PREAMBLE = "import torch\n\n\n"


def apply(name, before, seed=0):
    return mutations.get_operator(name).apply(PREAMBLE + textwrap.dedent(before).lstrip("\n"), random.Random(seed))


def assert_rewrites(name, before, after, seed=0):
    result = apply(name, before, seed)
    assert isinstance(result, mutations.Applied), result
    assert result.source == PREAMBLE + textwrap.dedent(after).lstrip("\n")
    return result


def assert_declines(name, before):
    result = apply(name, before)
    assert isinstance(result, mutations.Declined), result.source
    return result.reason


def test_fuse_linears():
    result = assert_rewrites("fuse_linears", '''
        def qkv_proj(x, layer):
            # three projections
            return x @ layer["q"].T, x @ layer["k"].T, x @ layer["v"].T
        ''', '''
        def fused_rows(weights, keys):
            """The rows of weights[k] for k in keys as one matrix, stacked on first use; the parts
            become views of it, so whatever else reads them is unchanged and memory is not doubled."""
            name = "+".join(keys)
            if name not in weights:
                fused = torch.cat([weights[k] for k in keys])  # [sum of rows, in]
                for k, part in zip(keys, fused.split([weights[k].shape[0] for k in keys])):
                    weights[k] = part
                weights[name] = fused
            return weights[name]


        def qkv_proj(x, layer):
            # three projections
            # One matmul by the stacked weights instead of 3: one launch, one read of the input.
            q_out, k_out, v_out = (x @ fused_rows(layer, ('q', 'k', 'v')).T).split((layer['q'].shape[0], layer['k'].shape[0], layer['v'].shape[0]), dim=-1)
            return q_out, k_out, v_out
        ''')
    assert result.args == {"function": "qkv_proj", "input": "x", "weights": "layer", "keys": ["q", "k", "v"]}


def test_fuse_linears_computes_the_same():
    namespace = {}
    exec(apply("fuse_linears", '''
        def mlp(x, layer):
            return (x @ layer["gate"].T) * (x @ layer["up"].T)
        ''').source, namespace)
    layer = {"gate": torch.randn(6, 4), "up": torch.randn(6, 4)}
    x = torch.randn(3, 4)
    expected = (x @ layer["gate"].T) * (x @ layer["up"].T)
    # The same products; a GEMM of another shape may sum in another order, hence allclose.
    assert torch.allclose(namespace["mlp"](x, layer), expected, rtol=1e-6, atol=1e-6)
    assert layer["gate"].data_ptr() == layer["gate+up"].data_ptr()  # views: no extra memory


def test_fuse_linears_declines_one_matmul_or_different_inputs():
    assert assert_declines("fuse_linears", '''
        def f(x, y, layer):
            return x @ layer["a"].T, y @ layer["b"].T
        ''')


def test_torch_compile():
    result = apply("torch_compile", '''
        # allele: fused
        def mlp(x, layer):
            return x
        ''', seed=2)
    assert result.args == {"gene": "mlp", "mode": "default", "dynamic": None}
    assert result.source.endswith(textwrap.dedent('''
        # allele: fused
        @compiled_unless_bf16(mode='default', dynamic=None)
        def mlp(x, layer):
            return x
        '''))
    assert "def compiled_unless_bf16(mode, dynamic):" in result.source  # the helper came along


def test_torch_compile_runs_bf16_calls_as_written(monkeypatch):
    """Inductor's bf16 rounding missed the reference on an H100: bf16 calls skip it."""
    compiled_calls = []

    def fake_compile(fn, mode, dynamic):
        return lambda *args, **kwargs: compiled_calls.append(args) or fn(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", fake_compile)
    names = {}
    exec(compile(apply("torch_compile", '''
        # allele: fused
        def mlp(x, layer):
            return x * layer["w"]
        ''', seed=2).source, "child", "exec"), names)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.ones(2, dtype=dtype)
        assert torch.equal(names["mlp"](x, {"w": torch.full((2,), 3, dtype=dtype)}), 3 * x)
    assert [args[0].dtype for args in compiled_calls] == [torch.float16, torch.float32]  # bf16 ran as written
    rope = names["compiled_unless_bf16"]("default", None)(lambda positions, dtype: dtype)
    assert rope(torch.arange(3), torch.bfloat16) is torch.bfloat16 and len(compiled_calls) == 2


def test_torch_compile_declines_compiled_and_triton_genes():
    assert assert_declines("torch_compile", '''
        @torch.compile()
        def mlp(x, layer):
            return x


        # allele: triton
        def rms_norm(x, weight, eps):
            return x
        ''')


def test_tune_constant():
    result = assert_rewrites("tune_constant", '''
        PAGE_SIZE = 16  # range: 8..256; tokens per page
        OTHER = 3
        ''', '''
        PAGE_SIZE = 32  # range: 8..256; tokens per page
        OTHER = 3
        ''', seed=0)
    assert result.args == {"constant": "PAGE_SIZE", "old": 16, "new": 32}


def test_tune_constant_steps_a_count_by_one_where_its_range_says_so():
    """Pipeline stages: 3 lies between a halving and a doubling of 2; from 1 only up."""
    moves = set()
    for seed in range(8):
        result = tune_constant("""
            STAGES = 2  # range: 1..4, step 1; pipeline stages
            """, seed)
        moves.add(result.args["new"])
        assert f"STAGES = {result.args['new']}  # range: 1..4, step 1; pipeline stages" in result.source
    assert moves == {1, 3}
    assert tune_constant("STAGES = 1  # range: 1..4, step 1\n", 0).args["new"] == 2
    up = mutations.get_operator("tune_constant").extend("STAGES = 3  # range: 1..4, step 1\n",
                                                        {"constant": "STAGES", "old": 2, "new": 3})
    assert up.args == {"constant": "STAGES", "old": 3, "new": 4}


def test_tune_constant_moves_zero_to_one():
    assert tune_constant("READY = 0  # range: 0..256\n", 0).args == {"constant": "READY", "old": 0, "new": 1}


def tune_constant(source: str, seed: int):
    result = apply("tune_constant", source, seed)
    assert isinstance(result, mutations.Applied), result
    return result


def test_tune_constant_declines_undeclared_or_stuck_constants():
    assert assert_declines("tune_constant", '''
        PAGE_SIZE = 16
        FIXED = 8  # range: 8..8
        ''')


def test_hoist_tables():
    assert_rewrites("hoist_tables", '''
        class Engine:
            def __init__(self, model_config, device):
                self.device = device
                self.head_dim = model_config["head_dim"]
                self.other = 1

            def forward(self, step):
                cos, sin = rope_tables(step.positions, self.head_dim)
                return cos
        ''', '''
        class Engine:
            def __init__(self, model_config, device):
                self.device = device
                self.head_dim = model_config["head_dim"]
                # rope_tables for every position, built once: each call gathers its rows instead.
                self.rope_tables_cos, self.rope_tables_sin = rope_tables(torch.arange(int(model_config.get('max_position_embeddings') or 4096), device=self.device), self.head_dim)
                self.other = 1

            def forward(self, step):
                cos, sin = (self.rope_tables_cos[step.positions], self.rope_tables_sin[step.positions])
                return cos
        ''')


def test_hoist_tables_declines_calls_with_per_call_arguments():
    assert assert_declines("hoist_tables", '''
        class Engine:
            def __init__(self, model_config, device):
                self.device = device

            def forward(self, step, head_dim):
                return rope_tables(step.positions, head_dim)
        ''')


def test_last_token_logits():
    assert_rewrites("last_token_logits", '''
        def forward(self, x, step):
            logits = rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T  # [N, vocab]
            last = torch.tensor(step.num_new).cumsum(0) - 1
            return logits[last]
        ''', '''
        def forward(self, x, step):
            last = torch.tensor(step.num_new).cumsum(0) - 1
            logits = rms_norm(x[last], self.w["norm"], self.eps) @ self.w["lm_head"].T  # [B, vocab]: the norm and lm_head see each request's last token only
            return logits
        ''')


def test_last_token_logits_declines_when_the_index_uses_the_logits():
    assert assert_declines("last_token_logits", '''
        def forward(self, x):
            logits = rms_norm(x, self.w["norm"], self.eps) @ self.w["lm_head"].T
            best = logits.argmax(0)
            return logits[best]
        ''')


def test_rewrites_keep_comments_and_markers_through_the_seed():
    seed = program.SEED_PATH.read_text()
    child = mutations.get_operator("allele.KVCache.slab").apply(seed, random.Random(0)).source
    for name in ("last_token_logits", "hoist_tables", "fuse_linears"):
        child = mutations.get_operator(name).apply(child, random.Random(0)).source
    assert "# allele: slab\nclass KVCache" in child
    assert "# [N, hidden]" in child and "# broadcast over heads" in child


PDL_BEFORE = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def share(n, BLOCK: tl.constexpr):
    return n // BLOCK


@triton.jit
def double_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """x *= 2."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + share(n, BLOCK) * 0
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


def rms_norm(x, w, eps):
    double_kernel[(1,)](x, x.numel(), BLOCK=16,)
    return x
'''


def test_programmatic_launch():
    result = mutations.get_operator("programmatic_launch").apply(PDL_BEFORE, random.Random(0))
    assert isinstance(result, mutations.Applied), result
    assert result.args == {"kernels": ["double_kernel"]}  # `share` is called by a kernel: a device function
    assert result.source == '''\
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def share(n, BLOCK: tl.constexpr):
    return n // BLOCK


@triton.jit
def double_kernel(x_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """x *= 2."""
    if PDL:  # let the next kernel start (it waits for this one's writes); wait for the one before
        gdc_launch_dependents()
        gdc_wait()
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + share(n, BLOCK) * 0
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

# Programmatic dependent launch needs a Hopper or later GPU, and Triton's interpreter has none.
PDL_LAUNCH = (os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()
              and torch.cuda.get_device_capability()[0] >= 9)


def rms_norm(x, w, eps):
    double_kernel[(1,)](x, x.numel(), BLOCK=16, PDL=PDL_LAUNCH, launch_pdl=PDL_LAUNCH)
    return x
'''
    again = mutations.get_operator("programmatic_launch").apply(result.source, random.Random(0))
    assert isinstance(again, mutations.Declined) and "without programmatic" in again.reason


def test_programmatic_launch_flags_the_launches_of_a_kernel_that_places_its_own_wait():
    """A kernel with the flag already (its wait after loads no kernel of the step writes)
    keeps its body; its launch gets the flag, and then nothing is left to do."""
    own_wait = PDL_BEFORE.replace("BLOCK: tl.constexpr):\n    \"\"\"x *= 2.\"\"\"\n",
                                  "BLOCK: tl.constexpr, PDL: tl.constexpr = False):\n    \"\"\"x *= 2.\"\"\"\n"
                                  "    if PDL:\n        gdc_wait()\n")
    assert own_wait.count("gdc_wait()") == 1
    result = mutations.get_operator("programmatic_launch").apply(own_wait, random.Random(0))
    assert isinstance(result, mutations.Applied), result
    assert result.args == {"kernels": ["double_kernel"]}
    assert result.source.count("gdc_wait()") == 1 and "gdc_launch_dependents()" not in result.source
    assert "BLOCK=16, PDL=PDL_LAUNCH, launch_pdl=PDL_LAUNCH)" in result.source
    again = mutations.get_operator("programmatic_launch").apply(result.source, random.Random(0))
    assert isinstance(again, mutations.Declined) and "without programmatic" in again.reason


def test_programmatic_launch_declines_programs_without_triton_kernels():
    assert "no Triton kernel" in mutations.get_operator("programmatic_launch").applies(program.SEED_PATH.read_text())


def test_prefetched_linears():
    seed = program.SEED_PATH.read_text()
    assert "CUDA graphs" in mutations.get_operator("prefetched_linears").applies(seed)  # launched from Python
    graphs = mutations.get_operator("allele.Engine.cuda_graphs").apply(seed, random.Random(0)).source
    result = mutations.get_operator("prefetched_linears").apply(graphs, random.Random(0))
    assert isinstance(result, mutations.Applied), result
    # every matmul by a subscripted weight: a layer's, and an expert's of it (layer["experts_up"][e])
    assert len(result.args["sites"]) == graphs.count('"].T') + graphs.count('"][e].T')
    source = result.source
    assert "@ layer[" not in source and 'prefetched_linear(x, layer["q"])' in source
    assert 'prefetched_linear(F.silu(prefetched_linear(x, layer["gate"])) * prefetched_linear(x, layer["up"]), ' \
        'layer["down"])' in source  # a matmul's own parentheses go with it
    assert "softmax(scores, dim=-1).to(v.dtype) @ v" in source  # not a weight
    module = program.parse(source)
    from mutations.rewrites.programmatic_launch import kernels_without_flag
    assert kernels_without_flag(module) == []  # every kernel lets the next one start early
    assert {"prefetched_linear", "prefetched_linear_kernel", "sum_shares_kernel", "PDL_LAUNCH"} <= \
        set(program.definitions(module))
    assert source.count("PDL=PDL_LAUNCH") == source.count("launch_pdl=PDL_LAUNCH") == 2  # both kernels
    again = mutations.get_operator("prefetched_linears").apply(source, random.Random(0))
    assert isinstance(again, mutations.Declined) and "no matmul" in again.reason
