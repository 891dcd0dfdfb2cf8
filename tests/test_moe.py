"""Qwen3-MoE checkpoints made by `transformers` itself: the reference and the seed engine are
held to `Qwen3MoeForCausalLM`'s logits, in fp32 and bf16, single-file and sharded; a checkpoint
whose config and tensors disagree is an error naming the tensor.

Every model is tiny (hidden 32, 8 experts of 16, top 2, 3 layers, the middle one dense
through mlp_only_layers) with every parameter drawn at random (tests/test_hf.py's randomize)."""
import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from contract.checkpoint import load_checked_weights
from contract.layout import weight_shapes
from contract.loader import load_engine_module
from contract.model_config import ConfigError, ModelConfig
from fitness import reference_logits
from fitness.gate import check_module
from fitness.traces import public_sequence
from target import hf_checkpoints
from tests.conftest import SEED_ENGINE
from tests.test_hf import assert_engine_matches, assert_reference_matches, randomize

SHAPE = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
             mlp_only_layers=[1], vocab_size=320, max_position_embeddings=160, rms_norm_eps=1e-6,
             tie_word_embeddings=False)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_checkpoint(folder, dtype: torch.dtype, sharded: bool = False, **changes):
    """A random Qwen3-MoE checkpoint saved by save_pretrained; the directory."""
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**SHAPE, "norm_topk_prob": True, **changes}))
    randomize(model)
    model.to(dtype).save_pretrained(folder, max_shard_size="20KB" if sharded else "1GB")
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(dtype name, sharded): directory}, and ("fp32", "no_norm"): one without renormalisation."""
    made = {(name, False): make_checkpoint(tmp_path_factory.mktemp(f"moe_{name}"), dtype)
            for name, dtype in DTYPES.items()}
    made["fp32", True] = make_checkpoint(tmp_path_factory.mktemp("moe_sharded"), torch.float32, sharded=True)
    made["fp32", "no_norm"] = make_checkpoint(tmp_path_factory.mktemp("moe_no_norm"), torch.float32,
                                              norm_topk_prob=False)
    return made


KEYS = [("fp32", False), ("bf16", False), ("fp32", True), ("fp32", "no_norm")]
IDS = ["fp32", "bf16", "fp32-sharded", "fp32-no-renormalisation"]


def test_the_config_reads_both_spellings_of_the_expert_count(checkpoints):
    folder = checkpoints["fp32", False]
    raw = json.loads((folder / "config.json").read_text())
    assert raw["num_local_experts"] == 8 and "num_experts" not in raw  # as transformers 5.24 writes it
    config = ModelConfig.load(folder)
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (8, 2, True)
    assert [config.is_sparse_layer(i) for i in range(3)] == [True, False, True] and config.qk_norm
    raw["num_experts"] = raw.pop("num_local_experts")
    assert ModelConfig.from_dict(raw) == config


@pytest.mark.parametrize("key", KEYS, ids=IDS)
def test_reference_matches_transformers(checkpoints, key):
    assert_reference_matches(checkpoints[key])


@pytest.mark.parametrize("key", KEYS, ids=IDS)
def test_seed_engine_matches_transformers(checkpoints, key):
    assert_engine_matches(load_engine_module(SEED_ENGINE), checkpoints[key])


# --- config and tensors that disagree -------------------------------------------------------

def rewritten(source, folder, edit):
    """A copy of the single-file checkpoint `source` with its tensors edited in place."""
    folder = shutil.copytree(source, folder)
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_missing_expert_is_named(checkpoints, tmp_path):
    folder = rewritten(checkpoints["fp32", False], tmp_path / "missing",
                       lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(ConfigError, match=r"lacks 1 tensors, e\.g\. layers\.2\.mlp\.experts\.5\.up_proj\.weight"):
        load_checked_weights(ModelConfig.load(folder), folder)


def test_an_expert_of_the_wrong_shape_is_named(checkpoints, tmp_path):
    def narrow(tensors):
        name = "model.layers.0.mlp.experts.3.down_proj.weight"
        tensors[name] = tensors[name][:, :8].contiguous()
    folder = rewritten(checkpoints["fp32", False], tmp_path / "narrow", narrow)
    with pytest.raises(ConfigError, match=r"layers\.0\.mlp\.experts\.3\.down_proj\.weight has shape \(32, 8\)"):
        load_checked_weights(ModelConfig.load(folder), folder)


@pytest.mark.parametrize("num_experts, message", [
    (4, r"layers\.0\.mlp\.gate\.weight has shape \(8, 32\), the config implies \(4, 32\)"),
    (16, r"lacks .* tensors, e\.g\. layers\.0\.mlp\.experts\.10\.down_proj\.weight"),
])
def test_a_config_with_another_expert_count_names_a_tensor(checkpoints, tmp_path, num_experts, message):
    folder = shutil.copytree(checkpoints["fp32", False], tmp_path / "recounted")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "num_local_experts": num_experts}))
    with pytest.raises(ConfigError, match=message):
        load_checked_weights(ModelConfig.load(folder), folder)


def test_experts_the_config_does_not_have_are_named(checkpoints, tmp_path):
    """A dense layer (mlp_only_layers) that stores experts anyway: not read silently as dense."""
    def add_experts(tensors):
        for name in [n for n in tensors if n.startswith("model.layers.0.mlp.")]:
            tensors[name.replace("layers.0.", "layers.1.")] = tensors[name].clone()
    folder = rewritten(checkpoints["fp32", False], tmp_path / "extra", add_experts)
    with pytest.raises(ConfigError, match=r"MLP tensors its config does not imply .* e\.g\. layers\.1\.mlp\.experts\.0"):
        load_checked_weights(ModelConfig.load(folder), folder)


# --- routing near-ties in the gate (fitness/reference_logits.py) -----------------------------

SEED = SEED_ENGINE.read_text()
TOP_K = '    weights, experts = torch.topk(probs, layer["top_k"], dim=-1)\n'


def routed_as(new: str, old: str = TOP_K) -> str:
    assert SEED.count(old) == 1, old
    return SEED.replace(old, new)


WRONG_ROUTERS = {  # bug -> (checkpoint, the seed with it)
    "no renormalisation": (("fp32", False), routed_as("    if False:\n", '    if layer["renormalise"]:\n')),
    "the (k+1)-th expert in place of the k-th": (("fp32", False), routed_as(
        '    weights, experts = torch.topk(probs, layer["top_k"] + 1, dim=-1)\n'
        '    weights, experts = torch.cat((weights[:, :-2], weights[:, -1:]), 1), '
        'torch.cat((experts[:, :-2], experts[:, -1:]), 1)\n')),
    "softmax after the top k": (("fp32", "no_norm"), routed_as(
        '    weights, experts = torch.topk(x @ layer["router"].T, layer["top_k"], dim=-1)\n'
        '    weights = torch.softmax(weights.float(), dim=-1)\n')),
}
# Where two experts tie, the other one: top k over the experts in reverse order.
OTHER_AT_A_TIE = routed_as('    weights, experts = torch.topk(probs.flip(-1), layer["top_k"], dim=-1)\n'
                           '    experts = probs.shape[-1] - 1 - experts  # the indices in the forward order\n')


def gate(source, folder, scratch, tmp_path):
    path = tmp_path / "candidate.py"
    path.write_text(source)
    return check_module(load_engine_module(path), ModelConfig.load(folder), folder, "cpu", 5, scratch, derived=False)


@pytest.fixture(scope="module")
def tied(checkpoints, tmp_path_factory):
    """The fp32 checkpoint with experts 0 and 1 of layer 2 routed alike (one router row, 10x
    its own: a tie is then rare, and its request's later rows are excused)."""
    folder = shutil.copytree(checkpoints["fp32", False], tmp_path_factory.mktemp("tied") / "tied")
    tensors = load_file(folder / "model.safetensors")
    router = tensors["model.layers.2.mlp.gate.weight"]
    router[0] = router[1] = 10 * router[0]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_an_exact_engine_that_picks_the_other_expert_at_a_tie_passes(tied, scratch, tmp_path, monkeypatch):
    assert gate(SEED, tied, scratch, tmp_path).passed
    result = gate(OTHER_AT_A_TIE, tied, scratch, tmp_path)
    assert result.passed, result.error
    # The rule is what lets it through: held to the reference's own choice, it fails.
    monkeypatch.setattr(reference_logits, "boundary_gaps", lambda routing, k: torch.full(
        (len(routing), routing[0].shape[0]), float("inf")))
    result = gate(OTHER_AT_A_TIE, tied, scratch, tmp_path)
    assert not result.passed and result.stage == "target", result


@pytest.mark.parametrize("bug", WRONG_ROUTERS)
def test_the_gate_fails_a_wrong_router(checkpoints, scratch, tmp_path, bug):
    key, source = WRONG_ROUTERS[bug]
    result = gate(source, checkpoints[key], scratch, tmp_path)
    assert not result.passed and result.stage == "target", result


def test_a_checkpoint_whose_routing_ties_too_often_cannot_be_judged(checkpoints, tmp_path):
    """Every router row alike: every row ties, and the judge says so rather than judge nothing."""
    def one_router(tensors):
        for name in [n for n in tensors if n.endswith("mlp.gate.weight")]:
            tensors[name][:] = tensors[name][0]
    folder = rewritten(checkpoints["fp32", False], tmp_path / "all_tied", one_router)
    with pytest.raises(ConfigError, match="routing near-ties"):
        reference_logits.References("cpu").row_alternatives(ModelConfig.load(folder), folder, public_sequence(), 0)


# --- checkpoints the repository makes (target/hf_checkpoints.py) ------------------------------

def test_qwen3_30b_a3b_has_its_parameter_count():
    """30.5 B parameters, 57 GiB in bf16: its shape, checked without writing it."""
    config = ModelConfig.from_dict(hf_checkpoints.CHECKPOINTS["qwen3_30b_a3b"])
    shapes = weight_shapes(config.to_dict())
    assert sum(math.prod(shape) for shape in shapes.values()) / 1e9 == pytest.approx(30.532, abs=0.001)
    assert all(config.is_sparse_layer(i) for i in range(48)) and "lm_head.weight" in shapes
    assert shapes["layers.47.mlp.experts.127.down_proj.weight"] == (2048, 768)
    four = ModelConfig.from_dict(hf_checkpoints.CHECKPOINTS["qwen3_30b_a3b_4_layers"])
    assert four == config.derive(num_hidden_layers=4)


def test_the_writer_holds_one_shard_and_transformers_reads_what_it_wrote(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_checkpoints, "MAX_SHARD_BYTES", 200_000)
    saved = []
    save_file_as_written = hf_checkpoints.save_file
    monkeypatch.setattr(hf_checkpoints, "save_file", lambda tensors, *args, **kwargs: (
        saved.append(sum(t.numel() * t.element_size() for t in tensors.values())),
        save_file_as_written(tensors, *args, **kwargs)))
    folder = hf_checkpoints.write(tmp_path, "tiny_qwen3_moe")
    assert len(saved) > 2 and max(saved) <= 200_000  # the embedding alone is 131,072 bytes
    assert (folder / "model.safetensors.index.json").is_file()
    assert_reference_matches(folder)
    assert_engine_matches(load_engine_module(SEED_ENGINE), folder)
