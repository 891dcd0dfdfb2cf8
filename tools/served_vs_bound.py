"""A serve.bench report beside the roofline: each level's output tokens/s over the most its
workload allows the model on a GPU (fitness.roofline.served_bound: the level's requests in
waves of its concurrency, each wave a prefill of its prompts then a decode step per further
token, every pass at max(bytes / bandwidth, FLOPs / tensor rate)).

    python -m tools.served_vs_bound OUT/bench.json --model-config DIR/config.json [--gpu h200|auto]

`--gpu auto`: this machine's GPU (fitness.roofline.known_gpu); on one the roofline does not
know, the report is left as it is.

Prints a line per level and writes `bound_output_tokens_per_s` and `of_bound` into each level
of the report. The lengths are the report's own settings (--input-len, --output-len).
"""
import argparse
import json
from pathlib import Path

from contract.model_config import ModelConfig
import torch

from fitness.roofline import GPUS, known_gpu, served_bound


def beside_bound(report: dict, config: ModelConfig, gpu: str) -> list:
    """The report's levels (the sweep's, then the burst), each with its bound and its share of it."""
    settings = report["settings"]
    levels = report["sweep"] + ([report["burst"]] if report.get("burst") else [])
    for level in levels:
        bound = served_bound(config, level["concurrency"], level["requests"], settings["input_len"],
                             settings["output_len"], gpu)
        level["bound_output_tokens_per_s"] = round(bound, 1)
        level["of_bound"] = float(f"{level['output_tokens_per_s'] / bound:.4g}")  # a toy model's: 1e-5
    return levels


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="serve.bench's bench.json (rewritten with the bounds)")
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--gpu", choices=sorted(GPUS) + ["auto"], default="h200")
    args = parser.parse_args(argv)
    gpu = args.gpu
    if gpu == "auto":
        gpu = known_gpu("cuda") if torch.cuda.is_available() else None
        if gpu is None:
            print("no roofline for this machine's GPU: the report is left as it is")
            return
    report = json.loads(args.report.read_text())
    for level in beside_bound(report, ModelConfig.load(args.model_config), gpu):
        print(f"concurrency {level['concurrency']:>4}: {level['output_tokens_per_s']:>10,.1f} output tok/s, "
              f"{level['of_bound']:.3f} of {level['bound_output_tokens_per_s']:,.0f} ({gpu})")
    args.report.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
