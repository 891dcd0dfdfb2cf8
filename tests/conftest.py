import json
import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from contract import loader  # noqa: E402
from target.toy_weights import write as write_weights  # noqa: E402

# Replays kept on disk (mutations.replay_cache) would outlive a test's monkeypatched
# operators; the tests of the cache set their own folder.
os.environ["EVOLVE_REPLAY_CACHE"] = ""

# Tiny models on a 2-core machine: threads cost more than they give (measured ~100x on
# the bench tests). Judge child processes set their own.
torch.set_num_threads(1)

SEED_ENGINE = loader.SEED_ENGINE
FASTEST = REPO / "mutations" / "recipes" / "fastest.txt"  # the hand-kept recipe

# Small enough for CI, wide enough for four heads; weights use the public 0.02 init,
# the gate adds unit-scaled ones itself.
# An engine computing on a CPU in the dtype a GPU takes (bf16 when asked, otherwise fp16): the
# compute_dtype rule's CPU case dropped. A bf16 target's derived fp16 config computes in fp16.
CPU_CASE = '    if not str(device).startswith("cuda"):\n        return torch.float32\n'


def in_gpu_dtype(source: str) -> str:
    assert source.count(CPU_CASE) == 1
    return source.replace(CPU_CASE, "")


SMALL_CONFIG = {
    "model_type": "tiny_llama", "torch_dtype": "float16", "vocab_size": 256,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
    "max_position_embeddings": 160, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
}


@pytest.fixture(scope="session")
def small_target(tmp_path_factory):
    """(config path, weight dir) of a small model with toy weights."""
    root = tmp_path_factory.mktemp("small_target")
    config_path = root / "model_config.json"
    config_path.write_text(json.dumps(SMALL_CONFIG))
    write_weights(SMALL_CONFIG, root / "weights" / "model.pt", seed=1234)
    return config_path, root / "weights"


@pytest.fixture
def writable(tmp_path, monkeypatch):
    """A folder the candidates' runners may write, for a probe's log: fitness.isolation keeps
    every other read-only to them (RUNNER_WRITABLE is the judge's, out of their reach)."""
    folder = tmp_path / "writable"
    folder.mkdir()
    monkeypatch.setenv("RUNNER_WRITABLE", str(folder))
    return folder


def closed_off_here() -> None:
    """Skips a test of fitness.isolation where runners cannot be closed off (says why)."""
    from fitness import isolation
    missing = isolation.open_here()
    if missing:
        pytest.skip(f"runners cannot be closed off here: {'; '.join(missing)}")


@pytest.fixture
def open_runners(monkeypatch):
    """Runners started without fitness.isolation, to test the defences that hold without it
    (a user who cannot make a mount namespace has only those)."""
    monkeypatch.setenv("RUNNER_ISOLATION", "off")


@pytest.fixture(scope="session")
def fastest_source(tmp_path_factory):
    """The hand-kept recipe's program: its replay onto the seed takes 15-25 s on 2 cores, so
    the workers of one suite keep it in a folder they share (mutations.replay_cache;
    test_library replays every recipe itself)."""
    from mutations import recipe, replay_cache
    os.environ["EVOLVE_REPLAY_CACHE"] = str(tmp_path_factory.getbasetemp().parent / "replays")
    try:
        return replay_cache.apply(recipe.parse(FASTEST.read_text()), loader.SEED_ENGINE.read_text())
    finally:
        os.environ["EVOLVE_REPLAY_CACHE"] = ""


@pytest.fixture(scope="session")
def scratch(tmp_path_factory):
    """Shared cache of the gate's generated weights."""
    return tmp_path_factory.mktemp("gate_weights")


def requires_cuda():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
