import argparse
import itertools
import json
import statistics
import time
import types

import pytest
import torch

from contract.loader import load_engine_module
from contract.model_config import ModelConfig
from fitness import bench
from fitness.cases import decode_events, select_cases
from fitness.traces import count_tokens, materialize, public_sequence, replay
from target import toy_weights
from tools.memory_peak import live_at_peak

TINY = {"model_type": "tiny_llama", "torch_dtype": "float16", "vocab_size": 128, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256}
RESULT_KEYS = {"case_name", "elapsed_ms", "prefill_tokens", "decode_tokens", "total_tokens",
               "tokens_per_second", "decode_tokens_per_second", "peak_memory_mb", "engine_peak_mb",
               "run_ms"}


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread():
    # Tiny models gain nothing from threads, and on a busy machine two threads can be
    # a hundred times slower than one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def weight_dir(tmp_path):
    toy_weights.write(TINY, tmp_path / "model.pt", seed=1, std="unit")
    return tmp_path


@pytest.fixture(scope="module")
def seed_module():
    return load_engine_module("seed_engine/engine.py")


@pytest.mark.parametrize("name, expected", [
    ("prefill", (4 * 128, 0)),
    ("decode", (8 * 32, 16 * 8)),
    ("mixed", (4 * 64 + 2 * 128 + 4 * 32, 4 + 4 + 6 + 8 + 8)),
])
def test_public_case_token_counts(name, expected):
    assert count_tokens(bench.public_cases()[name]) == expected


@pytest.mark.parametrize("name, expected", [
    ("prefill_4x128", (4 * 128, 0)),
    ("decode_8x128x16", (8 * 128, 16 * 8)),
    ("hidden_mixed", (640, 30)),
    ("mixed_128", (10 * 128, 30)),
])
def test_hidden_style_case_token_counts(name, expected):
    assert count_tokens(bench.hidden_style_cases()[name]) == expected


def test_public_cases_in_contract_order():
    assert list(bench.public_cases()) == ["prefill", "decode", "mixed"]


@pytest.mark.parametrize("name, events", {**bench.public_cases(), **bench.hidden_style_cases()}.items())
def test_case_touches_only_live_ids_and_ends_empty(name, events):
    live = set()
    for ev in events:
        if ev.kind == "prefill":
            live |= set(ev.request_ids)
            continue
        assert set(ev.request_ids) <= live, f"{name}: {ev} touches dead ids"
        # The contract: decode and remove take the lowest-numbered live ids.
        assert list(ev.request_ids) == sorted(live)[:len(ev.request_ids)], f"{name}: {ev}"
        if ev.kind == "remove":
            live -= set(ev.request_ids)
    assert not live, f"{name} leaves {live} alive"


def test_mixed_variants_share_one_schedule():
    mixed, mixed_128 = bench.public_cases()["mixed"], bench.hidden_style_cases()["mixed_128"]
    assert [(ev.kind, ev.request_ids) for ev in mixed] == [(ev.kind, ev.request_ids) for ev in mixed_128]
    assert all(set(ev.lengths) <= {128} for ev in mixed_128)


class RecordingEngine:
    """Logs (engine number, call kind, grad enabled) for every call to a shared list."""

    def __init__(self, log, number):
        self.log, self.number = log, number

    def prefill(self, request_ids, input_ids):
        self.log.append((self.number, "prefill", torch.is_grad_enabled()))
        return torch.zeros(len(request_ids), TINY["vocab_size"])

    def decode(self, request_ids, token_ids):
        self.log.append((self.number, "decode", torch.is_grad_enabled()))
        return torch.zeros(len(request_ids), TINY["vocab_size"])

    def remove(self, request_ids):
        self.log.append((self.number, "remove", torch.is_grad_enabled()))


def test_run_case_warms_one_engine_then_times_fresh_ones():
    log, created = [], []

    def create_engine(model_config, weight_dir, device):
        assert model_config is TINY  # the raw dict, untouched
        created.append(RecordingEngine(log, len(created)))
        return created[-1]

    events = bench.public_cases()["decode"]
    kinds = [ev.kind for ev in events]
    bench.run_case(types.SimpleNamespace(create_engine=create_engine), TINY, "unused", "cpu",
                   events, warmup=2, repeat=3)
    assert len(created) == 1 + 3
    expected = [(0, k) for k in kinds * 2] + [(n, k) for n in (1, 2, 3) for k in kinds]
    assert [(n, k) for n, k, _ in log] == expected
    assert not any(grad for _, _, grad in log)


def test_run_case_on_seed_engine(seed_module, weight_dir):
    events = bench.public_cases()["decode"]
    result = bench.run_case(seed_module, TINY, weight_dir, "cpu", events, repeat=2, case_name="decode")
    assert set(result) == RESULT_KEYS
    assert result["case_name"] == "decode"
    assert (result["prefill_tokens"], result["decode_tokens"], result["total_tokens"]) == (256, 128, 384)
    assert result["tokens_per_second"] > 0 and result["elapsed_ms"] > 0
    assert result["tokens_per_second"] == pytest.approx(384 / (result["elapsed_ms"] / 1e3))
    assert result["decode_tokens_per_second"] == pytest.approx(128 / (result["elapsed_ms"] / 1e3))
    assert result["peak_memory_mb"] == result["engine_peak_mb"] == 0.0
    assert len(result["run_ms"]) == 2 and result["elapsed_ms"] == pytest.approx(statistics.median(result["run_ms"]))


class SleepingEngine:
    """A decode step takes 10 ms whatever the batch; a prefill 100 ms, or `prefill_s`."""

    def __init__(self, prefill_s=0.1):
        self.prefill_s = prefill_s

    def prefill(self, request_ids, tokens):
        time.sleep(self.prefill_s)

    def decode(self, request_ids, tokens):
        time.sleep(0.01)

    def remove(self, request_ids):
        pass


def test_step_time_takes_the_prefill_out_of_a_fixed_batch_decode_case():
    cases = {"decode_1x8x3": decode_events(1, 8, 3), "mixed": select_cases("public")["mixed"]}
    assert [bench.fixed_batch_steps(events) for events in cases.values()] == [3, 0]
    module = types.SimpleNamespace(create_engine=lambda config, weights, device: SleepingEngine())
    results = bench.run_benchmark(module, TINY, "unused", "cpu", cases, warmup=0, repeat=1)
    bench.add_step_times(results, module, TINY, "unused", "cpu", cases, warmup=0, repeat=1)
    step, mixed = results
    # 130 ms over 3 steps would be 43 ms a step with the prefill left in.
    assert 10 <= step["ms_per_decode_step"] < 25
    assert "ms_per_decode_step" not in mixed
    bench.add_roofline(results, ModelConfig.from_dict(TINY), cases, "h100")
    assert step["fraction_of_step_roofline"] == pytest.approx(
        step["roofline_ms_per_decode_step"] / step["ms_per_decode_step"])
    assert 0 < step["roofline_ms_per_decode_step"] < step["ms_per_decode_step"]


def test_step_time_keeps_a_fresh_engines_prefill_noise_out():
    """Fresh engines whose prefills take 50, 300 or 150 ms in turn: the steps are timed inside
    each engine's own run, so the prefills' spread does not reach them."""
    prefills = itertools.cycle([0.05, 0.3, 0.15])
    module = types.SimpleNamespace(create_engine=lambda config, weights, device: SleepingEngine(next(prefills)))
    cases = {"decode_1x8x3": decode_events(1, 8, 3)}
    results = bench.run_benchmark(module, TINY, "unused", "cpu", cases, warmup=0, repeat=1)
    bench.add_step_times(results, module, TINY, "unused", "cpu", cases, warmup=0, repeat=1)
    assert 10 <= results[0]["ms_per_decode_step"] < 15


def test_recompute_baseline_matches_seed(seed_module, weight_dir):
    baseline = load_engine_module("fitness/baselines/recompute_engine.py")
    seed_engine = seed_module.create_engine(TINY, str(weight_dir), "cpu")
    recompute = baseline.create_engine(TINY, str(weight_dir), "cpu")
    for call in materialize(public_sequence(), TINY["vocab_size"], seed=7, device="cpu"):
        expected, got = replay(seed_engine, call), replay(recompute, call)
        if expected is None:
            continue
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, atol=1e-4), (call.event, (got - expected).abs().max())


def test_cli_prints_contract_json_with_roofline(weight_dir, tmp_path, capsys):
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(TINY))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--model-config", str(config_path), "--weight-dir", str(weight_dir),
                              "--device", "cpu", "--warmup", "0", "--repeat", "1", "--roofline",
                              "--gpu", "h100"])
    assert bench.cli(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["case_name"] for r in results] == ["prefill", "decode", "mixed"]
    for r in results:
        assert set(r) == RESULT_KEYS | {"roofline_tokens_per_second", "fraction_of_roofline"}
        assert r["fraction_of_roofline"] == pytest.approx(r["tokens_per_second"] / r["roofline_tokens_per_second"])


def test_cli_runs_only_the_cases_named(weight_dir, tmp_path, capsys):
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(TINY))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    flags = ["--model-config", str(config_path), "--weight-dir", str(weight_dir), "--device", "cpu", "--warmup", "0",
             "--repeat", "1"]
    assert bench.cli(parser.parse_args([*flags, "--case", "mixed", "--case", "prefill"])) == 0
    assert [r["case_name"] for r in json.loads(capsys.readouterr().out)] == ["prefill", "mixed"]  # the set's order
    assert bench.cli(parser.parse_args([*flags, "--case", "decode_1x128x64"])) == 2
    assert "no case decode_1x128x64 in 'public' (its cases: prefill, decode, mixed)" in capsys.readouterr().err


def test_cli_reports_missing_weights(tmp_path, capsys):
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(TINY))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--model-config", str(config_path), "--weight-dir", str(tmp_path / "none")])
    assert bench.cli(args) == 2
    assert "weights not found" in capsys.readouterr().err


def test_all_cases_measure_the_public_mixed_schedule_once():
    every = select_cases("all")
    # prefill_4x128 and hidden_mixed repeat the public prefill and mixed events exactly.
    assert list(every) == ["prefill", "decode", "mixed", "decode_8x128x16", "mixed_128"]
    assert "hidden_mixed" in select_cases("hidden")


def test_memory_peak_replays_the_allocator_to_its_highest_total_after_the_reset():
    # Phases begin at events 0 (warm create), 2 (warm run), 4 (fresh create), 5 (fresh run);
    # the peak is looked for from event 4 on.
    events = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": [{"name": "load", "line": 3}]},
        {"action": "alloc", "addr": 2, "size": 7},
        {"action": "alloc", "addr": 3, "size": 50},  # the warm run's pool, kept
        {"action": "free_requested", "addr": 2, "size": 7},
        {"action": "alloc", "addr": 4, "size": 100},
        {"action": "alloc", "addr": 5, "size": 30},  # a fresh run's activation
        {"action": "free_completed", "addr": 5, "size": 30},  # not a free of allocated bytes
        {"action": "free_requested", "addr": 5, "size": 30},
        {"action": "alloc", "addr": 6, "size": 20},
    ]
    owner = lambda frames: frames[0]["name"] if frames else "?"
    found = live_at_peak(events, [0, 2, 4, 5], 4, owner)
    assert found["peak"] == 280
    assert found["by_phase"] == {"warm create": 100, "warm run": 50, "fresh create": 100, "fresh run": 30}
    assert found["by_line"][("warm create", "load")] == 100


def test_a_bench_line_shows_the_spread_of_the_runs_behind_the_median():
    from tools.bench_line import line
    result = {"case_name": "decode", "tokens_per_second": 1000.0, "peak_memory_mb": 12.0, "run_ms": [9.5, 12.25, 10.0]}
    assert line("seed", [result]) == "seed decode=1000 runs 9.5-12.2ms 12MB"
    assert line("seed", [{**result, "engine_peak_mb": 7.0}]) == "seed decode=1000 runs 9.5-12.2ms 12MB (one engine 7MB)"
    del result["run_ms"]  # an older result file
    assert line("seed", [result]) == "seed decode=1000 12MB"


def test_the_fresh_runs_probe_keeps_every_run_apart(seed_module, weight_dir):
    from tools.probes.fresh_runs import case_runs
    runs = case_runs(seed_module, TINY, weight_dir, "cpu", bench.public_cases()["decode"], repeat=3)
    assert len(runs["ms"]) == 3 and all(ms > 0 for ms in runs["ms"])
    assert runs["new_segments"] == [0, 0, 0] and runs["peak_mb"] == 0  # a CPU allocates no CUDA segments
    assert runs["sm_mhz"] == [None, None, None]
