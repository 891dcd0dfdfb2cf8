"""The repository's other targets: valid configs, the run flags run.sh passes for each, and
run.sh --target (CPU, seconds; no target's weights are made here but a tiny one's)."""
import subprocess

import pytest

from contract.checkpoint import load_checked_weights
from contract.model_config import ModelConfig
from evolve.__main__ import build_parser
from fitness.cases import select_cases
from target import targets
from tests.conftest import REPO, SMALL_CONFIG


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_every_target_is_a_valid_config_whose_flags_the_search_takes(name, tmp_path, monkeypatch):
    model = ModelConfig.from_dict(targets.TARGETS[name].config)
    monkeypatch.setattr(targets.toy_weights, "ensure", lambda config_path, weight_dir: None)  # no weights
    flags = targets.run_flags(name, tmp_path)
    args = build_parser().parse_args(["run", *flags])
    assert ModelConfig.load(args.model_config) == model and args.weight_dir == tmp_path / name / "weights"


def test_the_issue_s_shapes():
    one_b, long = targets.TARGETS["one_b"].config, targets.TARGETS["long_prompts"].config
    assert (one_b["hidden_size"], one_b["num_hidden_layers"], one_b["num_attention_heads"],
            one_b["num_key_value_heads"], one_b["head_dim"], one_b["intermediate_size"],
            one_b["vocab_size"]) == (2048, 22, 32, 4, 64, 5632, 32000)
    assert targets.TARGETS["bf16"].config["torch_dtype"] == "bfloat16"
    assert long["head_dim"] == 128 and long["num_attention_heads"] * 128 == long["hidden_size"]
    prompts = [n for events in select_cases("long").values() for e in events if e.kind == "prefill" for n in e.lengths]
    assert min(prompts) == 2048 and max(prompts) == 4096 < long["max_position_embeddings"]


def test_a_target_s_files_are_made_once(tmp_path, monkeypatch):
    monkeypatch.setitem(targets.TARGETS, "tiny", targets.Target(SMALL_CONFIG, ("--margin", "1")))
    flags = targets.run_flags("tiny", tmp_path)
    weights = tmp_path / "tiny" / "weights" / "model.pt"
    made = weights.stat().st_mtime_ns
    assert flags[-2:] == ["--margin", "1"] and targets.run_flags("tiny", tmp_path) == flags
    assert weights.stat().st_mtime_ns == made
    load_checked_weights(ModelConfig.load(tmp_path / "tiny" / "model_config.json"), weights.parent)


def test_run_sh_names_a_target_it_cannot_make():
    out = subprocess.run(["bash", "run.sh", "--target", "nope"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "could not make target nope" in out.stderr
