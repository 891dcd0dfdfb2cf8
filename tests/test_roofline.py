import argparse
import json
from dataclasses import replace

import pytest

from contract.model_config import ModelConfig
from fitness import roofline
from fitness.cases import public_cases
from fitness.traces import decode, prefill

PUBLIC = ModelConfig.load("target/model_config.json")
TINY = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=256)


def test_tiny_bound_counted_by_hand():
    bound = roofline.case_bound(TINY, [prefill([0], [4]), decode([0])])
    # Weights: 2 layers * (10240 matmul + 64 norm) + 32 final norm + 4096 lm_head = 24736.
    # Prefill: + 4 embedding rows (128) + K/V of 4 tokens (4 * 128) + one logit row (128).
    # Decode: + 1 row (32) + K/V of 4 read and 1 written (5 * 128) + one logit row (128).
    assert bound["bytes"] == 2 * (24736 + 128 + 512 + 128) + 2 * (24736 + 32 + 640 + 128)
    # Prefill: 2*4*2*10240 linears + 2*32*128 lm_head + 4*2*16*2 * (1+2+3+4) attention.
    # Decode: 2*1*2*10240 + 2*32*128 + 256 * 5 keys.
    assert bound["flops"] == (163840 + 8192 + 2560) + (40960 + 8192 + 1280)
    assert bound["tokens_per_second"] == pytest.approx(5 / bound["seconds"])


def test_public_bounds_positive():
    for row in roofline.roofline_table(PUBLIC, public_cases(), "h100"):
        assert row["seconds"] > 0 and row["tokens_per_second"] > 0, row


def test_decode_memory_bound_and_prefill_compute_bound_on_public_config():
    cases = public_cases()
    assert roofline.case_bound(PUBLIC, cases["decode"])["bound_by"] == "memory"
    assert roofline.case_bound(PUBLIC, cases["prefill"])["bound_by"] == "compute"


def test_more_bandwidth_lowers_a_memory_bound_bound():
    h100 = roofline.GPUS["h100"]
    faster = replace(h100, bytes_per_second=2 * h100.bytes_per_second)
    events = public_cases()["decode"]
    assert roofline.case_bound(PUBLIC, events, faster)["seconds"] < roofline.case_bound(PUBLIC, events, h100)["seconds"]


def test_h200_bound_no_slower_than_h100():
    for events in public_cases().values():
        assert (roofline.case_bound(PUBLIC, events, "h200")["seconds"]
                <= roofline.case_bound(PUBLIC, events, "h100")["seconds"])


def test_decode_of_dead_request_is_an_error():
    with pytest.raises(ValueError, match=r"\[1\]"):
        roofline.forward_passes([prefill([0], [3]), decode([0, 1])])


def test_cli_table_and_json(capsys):
    parser = argparse.ArgumentParser()
    roofline.add_arguments(parser)
    assert roofline.cli(parser.parse_args(["--cases", "hidden"])) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in ("prefill_4x128", "decode_8x128x16", "hidden_mixed", "mixed_128"))
    assert roofline.cli(parser.parse_args(["--json", "--gpu", "h200"])) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["case_name"] for r in rows] == ["prefill", "decode", "mixed"]


def test_the_weights_read_are_the_layouts_a_familys_tensors_included():
    events = [prefill([0], [4])]
    with_biases = replace(TINY, qkv_bias=True, qk_norm=True)
    added = 2 * (32 + 32 + 32 + 16 + 16)  # per layer: q, k, v biases and the q, k norm weights
    assert roofline.case_bound(with_biases, events)["bytes"] == roofline.case_bound(TINY, events)["bytes"] + 2 * added
    tied = replace(TINY, tie_word_embeddings=True)  # the head is the embedding table, read whole all the same
    assert roofline.case_bound(tied, events) == roofline.case_bound(TINY, events)


def test_a_served_level_is_bounded_by_its_waves_of_prefill_and_decode():
    wave = roofline.served_events(4, 4, 16, 5)
    assert [e.kind for e in wave] == ["prefill"] + ["decode"] * 4 + ["remove"]
    assert wave[0].lengths == (16,) * 4
    two = roofline.served_events(4, 6, 16, 5)  # a second wave of the two left
    assert len(two) == 12 and two[6].request_ids == (4, 5) and two[6].lengths == (16, 16)
    # Each output token's share of one wave: prefill (the first) and decode steps (the rest).
    by_hand = 4 * 5 / roofline.case_bound(TINY, wave)["seconds"]
    assert roofline.served_bound(TINY, 4, 4, 16, 5) == pytest.approx(by_hand)
    assert roofline.served_bound(TINY, 4, 8, 16, 5) == pytest.approx(by_hand)  # two waves, twice the time
    # More requests at once share each pass's weights.
    assert roofline.served_bound(PUBLIC, 8, 8, 64, 16, "h200") > roofline.served_bound(PUBLIC, 4, 8, 64, 16, "h200")


def test_the_hybrids_hackathon_levels_beside_their_bound():
    # docs/log/2026-11-29-moe-search-from-seed-hybrid-one-gpu-sweep.md quotes these.
    from target.hf_checkpoints import QWEN3_5_35B_A3B
    config = ModelConfig.from_dict(dict(QWEN3_5_35B_A3B))
    bounds = [roofline.served_bound(config, c, 64, 1024, 323, "h200") for c in (1, 64)]
    assert bounds == pytest.approx([689, 3674], abs=1)
