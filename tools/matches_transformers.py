"""An engine file against transformers' own model on a Hugging Face checkpoint: a search's
winner checked against the model class its config.json names, not the judge's reference.

    python -m tools.matches_transformers ENGINE DIR [--decode 8] [--tolerance 0.01] [--device cuda]

Two random prompts (24 and 7 tokens) prefilled together, then greedy decode steps of both;
transformers runs each full sequence once, in fp32, and every logit the engine returned is
held to its own at `--tolerance` (atol = rtol, the contract's 1e-2 by default). Prints one
JSON line (calls, rows, the worst error and the worst as a fraction of the tolerance);
exits 1 when a logit is outside it. On a GPU the engine computes in the checkpoint's dtype
(bf16) and transformers in fp32 on the same device; the line then also gives transformers'
own model in that dtype held to its fp32 the same way (`yardstick_of_tolerance`): how far
the library's own bf16 is, beside ours.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from contract.loader import load_engine_module

PROMPT_LENGTHS = (24, 7)


def engine_rows(engine, vocab_size, num_decodes) -> tuple:
    """([(logits [B, vocab], [(request, position)])] of a prefill and greedy decodes, and each
    request's full sequence)."""
    gen = torch.Generator().manual_seed(0)
    sequences = {rid: torch.randint(0, vocab_size, (n,), generator=gen) for rid, n in enumerate(PROMPT_LENGTHS)}
    ids = list(sequences)
    logits = engine.prefill(ids, [sequences[rid] for rid in ids])
    calls = [(logits, [(rid, len(sequences[rid]) - 1) for rid in ids])]
    for _ in range(num_decodes):
        tokens = logits.float().argmax(-1)  # [B]
        for rid, token in zip(ids, tokens):
            sequences[rid] = torch.cat((sequences[rid], token[None].cpu()))
        logits = engine.decode(ids, tokens)
        calls.append((logits, [(rid, len(sequences[rid]) - 1) for rid in ids]))
    return calls, sequences


def held_to(calls, expected, tolerance) -> tuple:
    """(rows, worst |error|, worst as a fraction of the tolerance) of `calls`' logits against `expected`."""
    worst, worst_ratio, rows = 0.0, 0.0, 0
    for logits, places in calls:
        want = torch.stack([expected[rid][position] for rid, position in places]).float().cpu()
        error = (logits.float().cpu() - want).abs()
        worst = max(worst, float(error.max()))
        worst_ratio = max(worst_ratio, float((error / (tolerance + tolerance * want.abs())).max()))
        rows += len(places)
    return rows, worst, worst_ratio


def full_logits(model, sequences, device) -> dict:
    return {rid: model(seq[None].to(device)).logits[0] for rid, seq in sequences.items()}  # [T, vocab]


def compare(engine_path: Path, folder: Path, num_decodes: int, tolerance: float, device: str = "cpu") -> dict:
    config = json.loads((folder / "config.json").read_text())
    engine = load_engine_module(engine_path).create_engine(config, str(folder), device)
    with torch.no_grad():
        calls, sequences = engine_rows(engine, config["vocab_size"], num_decodes)
        del engine
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
        expected = full_logits(model, sequences, device)
        yardstick = None
        if device != "cpu":  # transformers' own model in the checkpoint's dtype, held the same way
            del model
            model = AutoModelForCausalLM.from_pretrained(folder).to(device)
            own = full_logits(model, sequences, device)
            _, _, yardstick = held_to([(own[rid][None, pos], [(rid, pos)]) for rid in own
                                       for pos in range(len(sequences[rid]) - num_decodes - 1, len(sequences[rid]))],
                                      expected, tolerance)
    rows, worst, worst_ratio = held_to(calls, expected, tolerance)
    return {"engine": str(engine_path), "model": str(folder), "device": device, "calls": len(calls), "rows": rows,
            "worst_abs_error": worst, "worst_of_tolerance": worst_ratio, "tolerance": tolerance,
            "yardstick_of_tolerance": yardstick, "matches": worst_ratio <= 1.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("model", type=Path, help="a Hugging Face directory: config.json and safetensors")
    parser.add_argument("--decode", type=int, default=8, help="greedy decode steps after the prefill")
    parser.add_argument("--tolerance", type=float, default=1e-2, help="atol = rtol (the contract's)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = compare(args.engine, args.model, args.decode, args.tolerance, args.device)
    print(json.dumps(result))
    return 0 if result["matches"] else 1


if __name__ == "__main__":
    sys.exit(main())
