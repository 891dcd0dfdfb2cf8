"""Executes one scheduled step through the engine's three calls, then samples.

The engine file is imported the way the judge imports it (`fitness.loader`), and driven
only through the contract: prefill, decode and remove by request id.
"""
import json
from pathlib import Path

import torch

from fitness.loader import load_engine_module
from serve.sampling import make_generator, sample
from serve.scheduler import Batch
from serve.sequence import SEQUENCE_IDS

WARM_UP_PROMPT_LEN = 16


def load_engine(engine_path, model_config_path, weight_dir, device: str):
    model_config = json.loads(Path(model_config_path).read_text())
    module = load_engine_module(engine_path)
    return module.create_engine(model_config, str(weight_dir), device)


class ModelRunner:
    def __init__(self, engine, device: str):
        self.engine = engine
        self.device = torch.device(device)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """One prefill, decode and remove, so that whatever an engine does lazily on its
        first calls is not paid by the first client."""
        request_id = next(SEQUENCE_IDS)
        prompt = torch.zeros(WARM_UP_PROMPT_LEN, dtype=torch.long, device=self.device)
        logits = self.engine.prefill([request_id], [prompt])
        self.engine.decode([request_id], logits.argmax(dim=-1))
        self.engine.remove([request_id])

    @torch.inference_mode()
    def run(self, batch: Batch) -> list:
        """The next token of every sequence in batch.prefill + batch.decode, in that order."""
        if batch.remove:
            self.engine.remove(batch.remove)
        logits = []
        if batch.prefill:
            logits.append(self.prefill(batch.prefill))
        if batch.decode:
            logits.append(self.decode(batch.decode))
        if not logits:
            return []
        seqs = batch.prefill + batch.decode
        tokens = sample(torch.cat(logits), [s.params for s in seqs], [s.generator for s in seqs])
        return tokens.tolist()  # the step's one host sync: the scheduler needs the tokens

    def prefill(self, seqs: list) -> torch.Tensor:
        for seq in seqs:
            seq.generator = make_generator(seq.params, self.device)
        prompts = [torch.tensor(s.prompt_token_ids, dtype=torch.long, device=self.device) for s in seqs]
        return self.engine.prefill([s.seq_id for s in seqs], prompts)

    def decode(self, seqs: list) -> torch.Tensor:
        tokens = torch.tensor([s.last_token_id for s in seqs], dtype=torch.long, device=self.device)
        return self.engine.decode([s.seq_id for s in seqs], tokens)
