"""Hugging Face checkpoints (Llama, Qwen2, Qwen3) made by `transformers` itself: the
reference, the seed engine and the fastest recipe's program are held to `transformers`'
own logits, and the gate rejects the layout bugs a fast engine could make.

Every model is tiny (hidden 64, 2 layers) with every parameter drawn at random: the
families' own init zeroes biases and sets norms to one, which would hide a dropped bias or
a norm weight permuted wrongly."""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

import mutations
from contract.checkpoint import check_weight_files, load_checked_weights
from contract.layout import weight_shapes
from contract.loader import load_engine_module
from contract.model_config import ConfigError, ModelConfig
from fitness.__main__ import build_parser
from fitness.gate import check_module
from fitness.reference import ReferenceModel
from fitness.reference_logits import References
from fitness.weight_files import TrustedFiles, WeightsChanged, fingerprint
from target import hf_checkpoints
from tests.conftest import REPO, SEED_ENGINE, in_gpu_dtype

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=320, max_position_embeddings=160, rms_norm_eps=1e-6)
# A short original context, so that the llama3 rule changes most frequencies of head_dim 16.
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True, rope_scaling=LLAMA3)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=True, head_dim=32)),  # not 64 / 4
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SEED = SEED_ENGINE.read_text()


def randomize(model) -> None:
    """Matrices with std 1/sqrt(fan_in), biases N(0, 0.25), norm weights 1 + N(0, 0.04)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2:
                param.normal_(0, 1 / math.sqrt(param.shape[1]))
            elif name.endswith(".bias"):
                param.normal_(0, 0.5)
            else:
                param.copy_(1 + 0.2 * torch.randn_like(param))


def make_checkpoint(folder, family: str, dtype: torch.dtype, sharded: bool = False):
    """A random checkpoint saved by save_pretrained (safetensors); the directory."""
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**SHAPE, **extra))
    randomize(model)
    model.to(dtype).save_pretrained(folder, max_shard_size="40KB" if sharded else "1GB")
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(family, dtype name, sharded): directory} made once for the module."""
    made = {}
    for family in FAMILIES:
        for name, dtype in DTYPES.items():
            made[family, name, False] = make_checkpoint(tmp_path_factory.mktemp(f"{family}_{name}"), family, dtype)
    made["qwen2", "fp32", True] = make_checkpoint(tmp_path_factory.mktemp("qwen2_sharded"), "qwen2",
                                                 torch.float32, sharded=True)
    return made


def hf_logits(folder, sequence) -> torch.Tensor:
    """transformers' own logits [T, vocab] in fp32, for every position of `sequence` (the
    model class its config.json names)."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(sequence[None]).logits[0]


def engine_calls(module, folder):
    """Two prompts prefilled, then three decode steps of both (the second request alone in
    the middle one): [(logits [B, vocab], [(request, position)])] and each full sequence."""
    engine = module.create_engine(json.loads((folder / "config.json").read_text()), str(folder), "cpu")
    gen = torch.Generator().manual_seed(3)
    sequences = {0: torch.randint(0, SHAPE["vocab_size"], (9,), generator=gen),
                 1: torch.randint(0, SHAPE["vocab_size"], (4,), generator=gen)}
    calls = [(engine.prefill([0, 1], [sequences[0], sequences[1]]), [(0, 8), (1, 3)])]
    for ids in ([0, 1], [1], [1, 0]):
        tokens = torch.randint(0, SHAPE["vocab_size"], (len(ids),), generator=gen)
        for rid, token in zip(ids, tokens):
            sequences[rid] = torch.cat((sequences[rid], token[None]))
        calls.append((engine.decode(ids, tokens), [(rid, len(sequences[rid]) - 1) for rid in ids]))
    return calls, sequences


def assert_engine_matches(module, folder, tolerance=1e-4):
    calls, sequences = engine_calls(module, folder)
    expected = {rid: hf_logits(folder, seq) for rid, seq in sequences.items()}
    for logits, rows in calls:
        want = torch.stack([expected[rid][position] for rid, position in rows])
        torch.testing.assert_close(logits.float(), want, atol=tolerance, rtol=tolerance)


KEYS = [(family, dtype, False) for family in FAMILIES for dtype in DTYPES] + [("qwen2", "fp32", True)]


def assert_reference_matches(folder):
    """The reference's logits of 12 random tokens are transformers' own."""
    config = ModelConfig.load(folder)
    reference = ReferenceModel(config, load_checked_weights(config, folder), "cpu")
    sequence = torch.randint(0, config.vocab_size, (12,), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(reference.forward(sequence), hf_logits(folder, sequence), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("key", KEYS, ids=lambda k: "-".join(map(str, k[:2])) + ("-sharded" if k[2] else ""))
def test_reference_matches_transformers(checkpoints, key):
    assert_reference_matches(checkpoints[key])


@pytest.mark.parametrize("key", KEYS, ids=lambda k: "-".join(map(str, k[:2])) + ("-sharded" if k[2] else ""))
def test_seed_engine_matches_transformers(checkpoints, key):
    assert_engine_matches(load_engine_module(SEED_ENGINE), checkpoints[key])


def test_config_spellings_before_transformers_5(checkpoints, tmp_path):
    """rope_theta and rope_scaling at the top level, torch_dtype: what older checkpoints
    (Llama 3.2's own) carry; read as the newer rope_parameters and dtype are."""
    folder = shutil.copytree(checkpoints["llama", "bf16", False], tmp_path / "old")
    raw = json.loads((folder / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope, torch_dtype=raw.pop("dtype"))
    (folder / "config.json").write_text(json.dumps(raw))
    assert ModelConfig.load(folder) == ModelConfig.load(checkpoints["llama", "bf16", False])
    assert_engine_matches(load_engine_module(SEED_ENGINE), folder)


def test_the_judge_takes_a_model_directory_for_its_config(checkpoints):
    """`--model-config DIR` names DIR/config.json, as `run.sh --model DIR` and ModelConfig do."""
    folder = checkpoints["llama", "bf16", False]
    args = build_parser().parse_args(["judge", str(SEED_ENGINE), "--model-config", str(folder),
                                      "--weight-dir", str(folder)])
    assert args.model_config == folder / "config.json"


def cpu_recipe_program() -> str:
    """The recipe's alleles that run on a CPU, on the seed: fused weights, cached RoPE
    tables, a slab K/V cache under the decode-graph engine (eager on a CPU), last-token logits."""
    source = SEED
    for name in ("allele.KVCache.slab", "allele.Engine.cuda_graphs", "allele.load_weights.fused_both",
                 "allele.rope_tables.cached", "last_token_logits"):
        result = mutations.get_operator(name).apply(source, random.Random(0))
        assert isinstance(result, mutations.Applied), result
        source = result.source
    return source


def test_the_recipes_program_matches_transformers_through_the_triton_interpreter(fastest_source, tmp_path):
    """The fastest recipe's program itself (Triton kernels, the prefill-graph engine run
    eagerly), on a CPU: its kernels run in Triton's interpreter, in a process of its own.
    A Qwen3-MoE too (tests/test_moe.py's checkpoint): its alleles keep the router and experts."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    families = [*FAMILIES, "qwen3_moe"]
    program = tmp_path / "fastest.py"
    program.write_text(fastest_source)  # this process's replay, made once for its tests
    done = subprocess.run([sys.executable, str(REPO / "tests" / "mutation_fixtures" / "recipe_vs_transformers.py"),
                           str(program), *families], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.split() == [word for family in families for word in ("ok", family)]


def test_only_the_contracts_bf16_asks_attention_to_round_like_its_reference():
    """The contract's reference computes in bf16, a checkpoint's in fp32 (its gate
    calibrated): only the former makes the fused attention kernels step aside, and a
    checkpoint's RoPE tables are fp32, the contract's in its compute dtype."""
    namespace = {}
    exec(compile(SEED, str(SEED_ENGINE), "exec"), namespace)
    rounds = namespace["rounds_like_reference"]
    assert rounds({"model_type": "tiny_llama"}, torch.bfloat16)
    assert not rounds({"model_type": "tiny_llama"}, torch.float16)
    for family in FAMILIES:
        assert not rounds({"model_type": family}, torch.bfloat16)
        assert namespace["rope_table_dtype"]({"model_type": family}, torch.bfloat16) == torch.float32
    assert namespace["rope_table_dtype"]({"model_type": "tiny_llama"}, torch.float16) == torch.float16


# --- the gate -------------------------------------------------------------------------------

def gate(source, folder, scratch, tmp_path, seed=5):
    path = tmp_path / "candidate.py"
    path.write_text(source)
    return check_module(load_engine_module(path), ModelConfig.load(folder), folder, "cpu", seed, scratch)


@pytest.mark.parametrize("family", FAMILIES)
def test_gate_passes_the_seed_on_each_family(checkpoints, scratch, tmp_path, family):
    result = gate(SEED, checkpoints[family, "bf16", False], scratch, tmp_path)
    assert result.passed, result.error
    assert "families" in result.stages


def planted(old: str, new: str) -> str:
    assert SEED.count(old) == 1, old
    return SEED.replace(old, new)


PLANTED = {  # bug -> (family, the seed with it)
    "rotate-half rows read as interleaved pairs": (
        "llama", planted("rope_rows(t, name, model_config) if ROTATE_HALF_ROWS.search(name) else t", "t")),
    "llama3 frequencies left unscaled": ("llama", planted("    if scaling is None:\n", "    if True:\n")),
    "q, k, v biases dropped": ("qwen2", planted('    if "q_bias" not in layer:\n', "    if True:\n")),
    "q/k norms missed": ("qwen3", planted('    if "q_norm" not in layer:\n', "    if True:\n")),
    "q/k norm weights read unpermuted": (
        "qwen3", planted("ROTATE_HALF_ROWS = re.compile(r\"self_attn\\.(q_proj|k_proj|q_norm|k_norm)\\.\")",
                         "ROTATE_HALF_ROWS = re.compile(r\"self_attn\\.(q_proj|k_proj)\\.\")")),
}


@pytest.mark.parametrize("computed_in", ["fp32", "bf16"])
@pytest.mark.parametrize("bug", PLANTED)
def test_gate_rejects_planted_layout_bugs(checkpoints, scratch, tmp_path, bug, computed_in):
    """On a bf16 checkpoint, by an engine computing in fp32 (as on a CPU) or in bf16 (as
    on a GPU): the error is counted in the calibrated allowance (see below), 0.5 the limit."""
    family, source = PLANTED[bug]
    result = gate(source if computed_in == "fp32" else in_gpu_dtype(source), checkpoints[family, "bf16", False],
                  scratch, tmp_path)
    assert not result.passed and result.stage == "target", result
    assert result.worst_ratio > 2


def test_gate_rejects_a_tied_head_read_from_the_embedding_where_a_head_is_stored(checkpoints, scratch, tmp_path):
    """A tied checkpoint that stores an lm_head.weight of its own anyway: transformers 5
    keeps that head (with a warning), and so must an engine."""
    folder = shutil.copytree(checkpoints["qwen3", "fp32", False], tmp_path / "own_head")
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"]) / 8
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    assert_engine_matches(load_engine_module(SEED_ENGINE), folder)
    always_embedding = planted('is_tied = model_config.get("tie_word_embeddings") and "lm_head.weight" not in raw',
                               'is_tied = model_config.get("tie_word_embeddings")')
    result = gate(always_embedding, folder, scratch, tmp_path)
    assert not result.passed and result.stage == "target", result


def test_derived_configs_reject_a_dropped_feature_on_the_contract_target(small_target, scratch, tmp_path):
    """The toy target has no biases: the derived "families" config is what catches an
    engine that drops them."""
    config_path, weight_dir = small_target
    path = tmp_path / "no_bias.py"
    path.write_text(PLANTED["q, k, v biases dropped"][1])
    result = check_module(load_engine_module(path), ModelConfig.load(config_path), weight_dir, "cpu", 5, scratch)
    assert not result.passed and result.case == "families", result


# --- bf16: a gate calibrated on the reference's own rounding ----------------------------------

def test_a_bf16_checkpoint_is_judged_against_fp32_with_a_calibrated_allowance(checkpoints, small_target):
    """The reference in bf16 misses fp32 by some tolerances on a bf16 checkpoint: that, times
    the headroom, is what one tolerance is worth; the contract's format keeps its own rule."""
    folder = checkpoints["llama", "bf16", False]
    references = References("cpu")
    allowance = references.allowance(ModelConfig.load(folder), folder)
    assert allowance > 10  # the reference's own bf16 error was over one tolerance
    config_path, weight_dir = small_target
    assert references.allowance(ModelConfig.load(config_path), weight_dir) == 1.0


def test_a_checkpoint_whose_reference_overflows_in_fp16_cannot_be_judged(scratch, tmp_path):
    """The reference in fp16 overflows on these weights (the MLPs 300x): its error against fp32,
    and so the allowance, was inf, and a wrong engine (every logit halved) passed the target's
    own weights. The judge says it cannot judge, and does not draw the traces again for it."""
    folder = hf_checkpoints.write(tmp_path, "tiny_qwen3")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "torch_dtype": "float16"}))
    tensors = load_file(folder / "model.safetensors")
    save_file({name: (t.float() * (300 if ".mlp." in name else 1)).half() for name, t in tensors.items()},
              folder / "model.safetensors")
    config = ModelConfig.load(folder)
    with pytest.raises(ConfigError, match="in float16 the reference's logits overflow"):
        References("cpu").allowance(config, folder)
    with pytest.raises(ConfigError, match="overflow") as refused:
        check_module(load_engine_module(SEED_ENGINE), config, folder, "cpu", 1, scratch)
    assert "more token seeds" not in str(refused.value)


@pytest.mark.parametrize("program", ["seed", "recipe"])
def test_the_bf16_gate_passes_an_honest_bf16_engine(checkpoints, scratch, tmp_path, program):
    source = SEED if program == "seed" else cpu_recipe_program()
    result = gate(in_gpu_dtype(source), checkpoints["llama", "bf16", False], scratch, tmp_path)
    assert result.passed, result.error
    assert result.worst_ratio < 0.4  # of the allowance; 0.5 is the target's limit


# --- configs and files that cannot be read ---------------------------------------------------

def test_unreadable_checkpoints_say_why(checkpoints, tmp_path):
    folder = shutil.copytree(checkpoints["qwen2", "fp32", True], tmp_path / "sharded")
    shard = sorted(folder.glob("*.safetensors"))[0]
    shard.unlink()
    config = ModelConfig.load(folder)
    with pytest.raises(ConfigError, match=f"shards that are not there: {shard.name}"):
        load_checked_weights(config, folder)
    (folder / "model.safetensors.index.json").unlink()
    with pytest.raises(ConfigError, match="weights not found"):
        load_checked_weights(config, folder)


def test_a_weights_file_cut_short_is_named_not_a_traceback(checkpoints, small_target, tmp_path):
    """A copy that stopped part way: what run.sh, bench and serve check before a model loads."""
    folder = shutil.copytree(checkpoints["llama", "fp32", False], tmp_path / "hf")
    contract_dir = shutil.copytree(small_target[1], tmp_path / "contract")
    for config, path in [(ModelConfig.load(folder), folder / "model.safetensors"),
                         (ModelConfig.load(small_target[0]), contract_dir / "model.pt")]:
        path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
        for read in (check_weight_files, load_checked_weights):
            with pytest.raises(ConfigError, match=f"{path.name} cannot be read .*cut short"):
                read(config, path.parent)


def test_shapes_are_checked_from_the_headers_as_from_the_tensors(checkpoints, tmp_path):
    """What bench and run.sh check before a 65 GB model is loaded: the headers alone."""
    folder = shutil.copytree(checkpoints["llama", "fp32", False], tmp_path / "checkpoint")
    config = ModelConfig.load(folder)
    check_weight_files(config, folder)
    stored = load_file(folder / "model.safetensors")
    name = "model.layers.0.self_attn.k_proj.weight"
    stored[name] = stored[name][:-1].contiguous()
    save_file(stored, folder / "model.safetensors")
    with pytest.raises(ConfigError, match=r"layers\.0\.self_attn\.k_proj\.weight has shape"):
        check_weight_files(config, folder)
    with pytest.raises(ConfigError, match=f"{name} has 31 rows, not a whole number of heads"):
        load_checked_weights(config, folder)


def test_every_file_of_a_sharded_checkpoint_is_held_to_its_fingerprint(checkpoints, tmp_path):
    """The fingerprint the search takes goes to its judges as JSON, and covers each shard."""
    folder = shutil.copytree(checkpoints["qwen2", "fp32", True], tmp_path / "sharded")
    trusted = TrustedFiles()
    trusted.trust(folder, expected=json.loads(json.dumps(fingerprint(folder))))
    shard = sorted(folder.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes())
    with pytest.raises(WeightsChanged):
        trusted.check()


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "RoPE type 'yarn'"),
    ({"attention_bias": True}, "o_proj"),
    ({"model_type": "mistral"}, "model_type 'mistral' is not supported"),
    ({"rope_parameters": dict(LLAMA3, high_freq_factor=0.5)}, "high_freq_factor > low_freq_factor"),
])
def test_unsupported_configs_say_why(checkpoints, change, message):
    raw = json.loads((checkpoints["llama", "fp32", False] / "config.json").read_text())
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict({**raw, **change})


# --- checkpoints the repository makes -------------------------------------------------------

def test_the_generated_tiny_qwen3_is_what_transformers_reads(tmp_path):
    folder = hf_checkpoints.write(tmp_path, "tiny_qwen3")
    assert_engine_matches(load_engine_module(SEED_ENGINE), folder)


@pytest.mark.parametrize("name, billions", [("llama_3_2_1b", 1.236), ("qwen3_0_6b", 0.596)])
def test_real_shapes_have_their_models_parameter_counts(name, billions):
    """Llama-3.2-1B has 1.24 B parameters and Qwen3-0.6B 0.60 B (both tied): the shapes
    are theirs, checked without writing gigabytes."""
    config = ModelConfig.from_dict(hf_checkpoints.CHECKPOINTS[name])
    shapes = weight_shapes(config.to_dict())
    assert sum(math.prod(shape) for shape in shapes.values()) / 1e9 == pytest.approx(billions, abs=0.001)
    assert config.tie_word_embeddings and "lm_head.weight" not in shapes


def test_shards_past_a_full_disk_go_to_the_overflow_folder_linked(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_checkpoints, "MAX_SHARD_BYTES", 100_000)
    monkeypatch.setattr(hf_checkpoints, "SPARE_BYTES", 0)
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(hf_checkpoints.shutil, "disk_usage",  # the disk fills after the first shard
                        lambda path: shutil._ntuple_diskusage(0, 0, free if not list(Path(path).glob("*.safetensors")) else 0))
    folder = hf_checkpoints.write(tmp_path / "out", "tiny_qwen3", overflow=tmp_path / "memory")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and not shards[0].is_symlink() and all(s.is_symlink() for s in shards[1:])
    assert all(s.resolve().parent == (tmp_path / "memory" / "tiny_qwen3").resolve() for s in shards[1:])
    assert_engine_matches(load_engine_module(SEED_ENGINE), folder)


def test_shards_split_past_the_limit(monkeypatch):
    monkeypatch.setattr(hf_checkpoints, "MAX_SHARD_BYTES", 100)
    assert hf_checkpoints.shards({"a": 60, "b": 60, "c": 120}) == [["a"], ["b"], ["c"]]
    assert hf_checkpoints.shards({"a": 40, "b": 60, "c": 120}) == [["a", "b"], ["c"]]


# --- the yardstick: tools.transformers_bench ------------------------------------------------

def test_transformers_decode_steps_are_timed_apart_from_the_prefill(monkeypatch):
    """A prefill of 0.5 s and decode steps of 20 ms read as 20 ms a step: the prefill's
    token is not counted as a step, nor its time spread over them."""
    from tools import transformers_bench
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE)).eval()
    forward = model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(0.5 if kwargs["input_ids"].shape[1] > 1 else 0.02)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", slow_forward)
    with torch.no_grad():
        result = transformers_bench.decode_case(model, batch=2, prompt=8, steps=3, repeat=2, device="cpu")
    assert len(result["run_ms_per_step"]) == 2
    assert 20 <= result["ms_per_step"] < 60, result
