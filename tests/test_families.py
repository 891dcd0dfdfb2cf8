"""Each model family is declared in one module of contract/families/; what it points at
exists, and what the engine files repeat of it (they stand alone) agrees with it."""
import ast

import pytest
import torch

from contract.families import FAMILIES, FEATURES, HF_FAMILIES, LAYOUTS, STRUCTURAL, idle_genes, own_genes
from contract.families.llama import LLAMA3_KEYS
from contract.layout import ROTATED, weight_shapes
from contract.model_config import ModelConfig, derived_configs
from target.toy_weights import generate
from tests.conftest import REPO, SEED_ENGINE, SMALL_CONFIG


def top_level_names(path) -> set:
    """Functions, classes and assigned names at a module's top level, and Class.method."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names.update(f"{node.name}.{item.name}" for item in node.body if isinstance(item, ast.FunctionDef))
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return names


@pytest.mark.parametrize("family", LAYOUTS, ids=lambda family: family.__name__.rsplit(".", 1)[-1])
def test_a_familys_reference_math_and_seed_genes_are_where_it_says(family):
    assert set(family.REFERENCE) <= top_level_names(REPO / "fitness" / "reference.py")
    assert set(family.SEED_GENES) <= top_level_names(SEED_ENGINE)


def test_the_seed_reads_the_families_the_contract_declares():
    seed = {}
    for node in ast.parse(SEED_ENGINE.read_text()).body:
        if isinstance(node, ast.Assign) and node.targets[0].id in ("HF_MODEL_TYPES", "LLAMA3_KEYS"):
            seed[node.targets[0].id] = ast.literal_eval(node.value)
    assert set(seed["HF_MODEL_TYPES"]) == set(HF_FAMILIES)
    assert seed["LLAMA3_KEYS"] == LLAMA3_KEYS


def test_the_families_config_turns_every_feature_on():
    families = derived_configs(ModelConfig.from_dict(SMALL_CONFIG))["families"]
    assert {f.field: getattr(families, f.field) for f in FEATURES} == {f.field: f.probe for f in FEATURES}
    assert all(f.probe != f.off for f in FEATURES)


@pytest.mark.parametrize("model_type", HF_FAMILIES)
def test_a_hugging_face_config_turns_on_what_its_family_implies(model_type):
    config = ModelConfig.from_dict({**SMALL_CONFIG, "model_type": model_type})
    assert config.is_hf
    for field, value in FAMILIES[model_type].TURNS_ON.items():
        assert getattr(config, field) == value


@pytest.mark.parametrize("feature", FEATURES, ids=lambda f: f.field)
def test_a_feature_alone_changes_only_its_own_tensors(feature):
    off = weight_shapes(SMALL_CONFIG)
    on = weight_shapes({**SMALL_CONFIG, feature.field: feature.probe})
    added, dropped = set(on) - set(off), set(off) - set(on)
    expected = {"tie_word_embeddings": (set(), {"lm_head.weight"}),
                "qkv_bias": ({f"layers.{i}.self_attn.{x}_proj.bias" for i in range(2) for x in "qkv"}, set()),
                "qk_norm": ({f"layers.{i}.self_attn.{x}_norm.weight" for i in range(2) for x in "qk"}, set()),
                "rope_scaling": (set(), set())}[feature.field]
    assert (added, dropped) == expected


def test_the_rotated_rows_are_q_and_ks_and_their_norms():
    names = weight_shapes({**SMALL_CONFIG, "qkv_bias": True, "qk_norm": True})
    assert {n for n in names if ROTATED.search(n)} == {
        f"layers.{i}.self_attn.{x}" for i in range(2)
        for x in ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias", "q_norm.weight", "k_norm.weight")}


def test_toy_weights_draw_a_familys_tensors_as_it_says():
    weights = generate({**SMALL_CONFIG, "qkv_bias": True, "qk_norm": True}, seed=3, std="unit")
    assert 0.5 < weights["layers.0.self_attn.q_proj.bias"].std() < 2  # qwen2: N(0, 1) when unit-scaled
    q_norm = weights["layers.0.self_attn.q_norm.weight"]  # qwen3: around 1, not 1
    assert not torch.equal(q_norm, torch.ones_like(q_norm)) and 0.5 < q_norm.mean() < 1.5
    assert torch.equal(weights["layers.0.input_layernorm.weight"], torch.ones(SMALL_CONFIG["hidden_size"]))


def test_the_families_config_leaves_structural_features_off():
    """An MoE MLP changes what a layer is: a dense target's `families` config has no experts,
    and its tensors are the dense MLP's, as before."""
    assert STRUCTURAL and not {f.field for f in STRUCTURAL} & {f.field for f in FEATURES}
    families = derived_configs(ModelConfig.from_dict(SMALL_CONFIG))["families"]
    assert all(getattr(families, f.field) == f.off for f in STRUCTURAL)
    assert not any(".mlp.experts." in name for name in weight_shapes(families.to_dict()))


def test_an_moe_target_keeps_its_experts_in_every_derived_config():
    config = ModelConfig.from_dict({**SMALL_CONFIG, "model_type": "qwen3_moe", "num_local_experts": 64,
                                    "num_experts_per_tok": 8, "moe_intermediate_size": 768, "mlp_only_layers": [0]})
    for name, derived in derived_configs(config).items():
        assert (derived.num_experts, derived.num_experts_per_tok, derived.mlp_only_layers) == (16, 8, (0,)), name
        assert derived.moe_intermediate_size == 512 and derived.is_sparse_layer(1) and not derived.is_sparse_layer(0)


def test_a_sparse_layer_has_a_router_and_experts_in_place_of_the_dense_mlp():
    names = weight_shapes({**SMALL_CONFIG, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                           "mlp_only_layers": [1]})
    assert names["layers.0.mlp.gate.weight"] == (4, SMALL_CONFIG["hidden_size"])
    assert names["layers.0.mlp.experts.3.down_proj.weight"] == (SMALL_CONFIG["hidden_size"], 8)
    assert "layers.0.mlp.gate_proj.weight" not in names and "layers.1.mlp.gate_proj.weight" in names
    assert not any(name.startswith("layers.1.mlp.experts") for name in names)


def test_a_config_owns_the_seed_genes_of_the_structural_families_it_has_and_idles_the_rest():
    from target.hf_checkpoints import QWEN3_30B_A3B, TINY_QWEN3_5_MOE, TINY_QWEN3_MOE
    moe, hybrid = FAMILIES["qwen3_moe"].SEED_GENES, FAMILIES["qwen3_5_moe_text"].SEED_GENES
    dense = ModelConfig.load(REPO / "target" / "model_config.json")
    # The tiny Qwen3-MoE keeps the dense MLP in its layer 1; in Qwen3-30B-A3B and the hybrid
    # every layer is sparse, so no timed call runs the dense MLP's gene.
    sparse, all_sparse, both = (ModelConfig.from_dict(dict(raw))
                                for raw in (TINY_QWEN3_MOE, QWEN3_30B_A3B, TINY_QWEN3_5_MOE))
    assert own_genes(dense) == frozenset() and idle_genes(dense) == frozenset(moe + hybrid)
    assert own_genes(sparse) == frozenset(moe) and idle_genes(sparse) == frozenset(hybrid)
    assert own_genes(all_sparse) == frozenset(moe) and idle_genes(all_sparse) == frozenset(hybrid + ("mlp",))
    assert own_genes(both) == frozenset(moe + hybrid) and idle_genes(both) == frozenset({"mlp"})
