"""An engine file that computes nothing: every prefill and decode call takes STEP_MS
milliseconds (asleep, the GIL released, as a host waiting on a GPU) and answers logits
whose argmax is the request's last token + 1. Served, what the server adds to STEP_MS per
output token is its own host cost, apart from any model
(docs/log/2026-11-25-server-host-cost-stand-in-engine.md):

    STEP_MS=2 python -m serve --engine tools/probes/fixed_step_engine.py \
        --model-config target/model_config.json --weight-dir target/weights --port 0 --device cpu
    python -m serve.bench --base-url URL --concurrency 64 --num-requests 128 \
        --input-len 128 --output-len 256 --burst 0

Its calls finish before they return, as no GPU's do: it cannot show what launching a step
ahead of reading the last one (serve.model_runner) gains on a GPU.
"""
import os
import time

import torch


class FixedStepEngine:
    def __init__(self, vocab_size: int, step_s: float):
        self.vocab_size = vocab_size
        self.step_s = step_s

    def logits_after(self, last_tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(len(last_tokens), self.vocab_size)
        logits[torch.arange(len(last_tokens)), (last_tokens + 1) % self.vocab_size] = 1.0
        return logits

    def prefill(self, request_ids, prompts):
        time.sleep(self.step_s)
        return self.logits_after(torch.stack([p[-1] for p in prompts]))

    def decode(self, request_ids, tokens):
        time.sleep(self.step_s)
        return self.logits_after(tokens)

    def remove(self, request_ids):
        pass


def create_engine(model_config: dict, weight_dir: str, device: str):
    return FixedStepEngine(model_config["vocab_size"], float(os.environ.get("STEP_MS", "1.5")) / 1e3)
