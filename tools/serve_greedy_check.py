"""Are a server's greedy completions the reference model's own, under a full batch?

    python -m tools.serve_greedy_check --base-url URL --model-config C --weight-dir W
        [--num-requests 32] [--input-len 128] [--output-len 64] [--device cuda]

Sends every request at once (temperature 0, random prompts of token ids, ignore_eos), then
runs the reference once per request over its prompt and the tokens that came back: by
causality, the logits at each position are the reference's own given what came before,
so the first position whose served token is not the reference's argmax is the first
divergence. A divergence is excused only where the reference's top two logits are within
the gate's tolerance of each other (a correct engine may flip them), as the contract
allows on a GPU; fp32 on a CPU should show none. Prints one JSON object; exits 1 on an
unexcused divergence.
"""
import argparse
import asyncio
import json
import sys

import httpx
import torch

from contract.checkpoint import load_checked_weights
from contract.model_config import ModelConfig
from fitness.reference import ReferenceModel
from fitness.tolerance import ATOL, RTOL


async def served_tokens(base_url: str, prompts: list, output_len: int) -> list:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600, limits=limits) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]

        async def one(prompt):
            body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            response = await http.post("/v1/completions", json=body)
            response.raise_for_status()
            return response.json()["choices"][0]["token_ids"]

        return await asyncio.gather(*(one(p) for p in prompts))


def first_divergence(reference: ReferenceModel, prompt: list, served: list) -> dict:
    """Where the served tokens first leave the reference's greedy path, if they do."""
    tokens = torch.tensor(prompt + served)
    positions = range(len(prompt) - 1, len(tokens) - 1)  # each predicts the next token
    logits = reference.forward(tokens, positions).float()  # [len(served), vocab]
    for step, (row, token) in enumerate(zip(logits, served)):
        top2 = row.topk(2).values
        if int(row.argmax()) != token:
            gap = float(top2[0] - top2[1])
            return {"step": step, "top2_gap": gap,
                    "excused": gap <= ATOL + RTOL * float(top2[0].abs())}
    return None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model-config", required=True)
    parser.add_argument("--weight-dir", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = ModelConfig.load(args.model_config)
    generator = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, config.vocab_size, (args.input_len,), generator=generator).tolist()
               for _ in range(args.num_requests)]
    served = asyncio.run(served_tokens(args.base_url, prompts, args.output_len))
    reference = ReferenceModel(config, load_checked_weights(config, args.weight_dir), args.device)
    divergences = [first_divergence(reference, p, s) for p, s in zip(prompts, served)]
    found = [d for d in divergences if d]
    unexcused = [d for d in found if not d["excused"]]
    print(json.dumps({"requests": len(prompts), "identical": len(prompts) - len(found),
                      "excused": len(found) - len(unexcused), "unexcused": unexcused}))
    sys.exit(1 if unexcused else 0)


if __name__ == "__main__":
    main()
