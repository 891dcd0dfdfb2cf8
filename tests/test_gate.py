"""The gate passes the seed and rejects every planted fault at the right stage."""
import random

import pytest
import torch

from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from fitness import traces
from fitness.gate import (DEFAULT_MARGIN, InProcessDriver, Tally, check_module, check_traces,
                          generated_weights, judging_weights, static_problems)
from fitness.reference_logits import References, histories
from fitness.traces import materialize
from fitness.weight_files import TRUSTED, WeightsChanged
from target.toy_weights import write as write_weights
from fitness.adversaries import planted
from tests.conftest import SEED_ENGINE


def gate(path, small_target, scratch, seed=11):
    config_path, weight_dir = small_target
    module = load_engine_module(path)
    return check_module(module, ModelConfig.load(config_path), weight_dir, "cpu", seed, scratch)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seed_engine_passes_every_stage(small_target, scratch, seed):
    result = gate(SEED_ENGINE, small_target, scratch, seed)
    assert result.passed, result.error
    assert set(result.stages) >= {"target", "churn", "target_unit", "gqa", "bf16", "head_dim",
                                  "deeper", "head_dim_256", "families"}
    assert result.num_calls > 150
    assert 0 < result.worst_ratio < DEFAULT_MARGIN


def test_seed_engine_is_statically_clean():
    assert static_problems(SEED_ENGINE.read_text()) == []


@pytest.mark.parametrize("fault,stage", sorted(planted.FAULTS.items()))
def test_planted_fault_is_rejected_at_its_stage(fault, stage, small_target, scratch, tmp_path):
    result = gate(planted.write_faulty(fault, tmp_path), small_target, scratch)
    assert not result.passed
    assert result.stage == stage, (result.stage, result.error)
    assert result.worst_ratio > DEFAULT_MARGIN or "remove does not free" in result.error


def test_ignored_remove_is_caught_by_the_churn_check(small_target, scratch, tmp_path):
    result = gate(planted.write_faulty("ignore_remove", tmp_path), small_target, scratch)
    assert result.case == "churn" and "remove does not free state" in result.error


def test_static_stage_rejects_foreign_imports_and_missing_entry_point():
    src = SEED_ENGINE.read_text()
    assert any("numpy" in p for p in static_problems(planted.imports_numpy(src)))
    assert any("importlib" in p for p in static_problems("import importlib\n" + src))
    assert any("create_engine" in p for p in static_problems(src.replace("def create_engine", "def make")))
    assert any("syntax" in p for p in static_problems(src + "\ndef broken(:\n"))
    assert any("__import__" in p for p in static_problems(src + "\n__import__('os')\n"))


def test_public_init_hides_a_rope_fault_that_unit_weights_expose(tmp_path):
    """Why the gate adds unit-scaled weights: with 0.02 weights a 24-wide model's logits
    are so small that rotate-half RoPE stays inside the tolerance."""

    config = ModelConfig(vocab_size=512, hidden_size=24, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=12,
                         max_position_embeddings=128)
    write_weights(config.to_dict(), tmp_path / "public" / "model.pt", seed=1234)
    module = load_engine_module(planted.write_faulty("rotate_half_rope", tmp_path))
    worst = {}
    for label, weight_dir in [("public", tmp_path / "public"), ("unit", generated_weights(config, tmp_path))]:
        tally = Tally(margin=float("inf"))
        check_traces(InProcessDriver(module, "cpu"), References("cpu"), config, weight_dir, 3, label, tally)
        worst[label] = tally.worst
    assert worst["public"] < DEFAULT_MARGIN < 1.0 < worst["unit"]


def test_generated_weights_are_the_judges_own_whatever_a_candidate_left(tmp_path):
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    weight_dir = generated_weights(config, tmp_path)
    made = torch.load(weight_dir / "model.pt", weights_only=True)
    zeroed = {name: torch.zeros_like(tensor) for name, tensor in made.items()}
    torch.save(zeroed, weight_dir / "model.pt")  # a candidate's rewrite, during a judgement
    with pytest.raises(WeightsChanged, match="changed on disk while candidates ran"):
        TRUSTED.check()
    # Left by an earlier judge process (this one never trusted it): rewritten before use.
    TRUSTED.known.pop(str(weight_dir.resolve()))
    assert generated_weights(config, tmp_path) == weight_dir and TRUSTED.intact(weight_dir)
    restored = torch.load(weight_dir / "model.pt", weights_only=True)
    assert all(torch.equal(restored[name], made[name]) for name in made)
    TRUSTED.check()  # and nothing else this process trusts has changed


def test_bf16_configs_are_judged_on_contract_init_weights(tmp_path):
    base = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    fp16 = torch.load(judging_weights(base, tmp_path) / "model.pt")
    bf16 = torch.load(judging_weights(base.derive(torch_dtype="bfloat16"), tmp_path) / "model.pt")
    assert abs(fp16["lm_head.weight"].std().item() - 32 ** -0.5) < 0.02  # unit: 1/sqrt(fan_in)
    assert abs(bf16["lm_head.weight"].std().item() - 0.02) < 0.002  # the contract's init


def test_references_read_once_per_request_life_equal_a_history_recomputed_per_call(small_target):
    """The judge runs each request's life once and reads every call's logits at its position;
    the contract's reference recomputes the history at each call. Within rounding, the same,
    also when an id is removed and used again (the churn rounds)."""


    config_path, weight_dir = small_target
    config = ModelConfig.load(config_path)
    references = References("cpu")
    rng = random.Random(5)
    cases = [traces.churn_round(rng) + traces.churn_round(rng)]  # ids reused after remove
    cases += list(traces.gate_traces(3, config.max_position_embeddings, full=False).values())[:3]
    for events in cases:
        got = references.trace(config, weight_dir, events, 7)
        calls = materialize(events, config.vocab_size, 7, "cpu")
        held, model = histories(calls), references.model(config, weight_dir)
        assert len(got) == len(calls)
        for i, call in enumerate(calls):
            if call.event.kind == "remove":
                assert got[i] is None
                continue
            expected = torch.stack([model.last_logits(held[i][rid]).float().cpu() for rid in call.event.request_ids])
            assert got[i].shape == expected.shape
            assert torch.allclose(got[i], expected, atol=1e-4, rtol=0), (i, (got[i] - expected).abs().max())
