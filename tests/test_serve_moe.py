"""`bash serve.sh` on a Qwen3-MoE checkpoint and on a Qwen3.5-MoE one (target/hf_checkpoints.py's
tiny ones, fp32 on a CPU): greedy completions are the reference's own while other requests
join and leave, so that each step routes a different mix of tokens to the experts and, in
the hybrid, carries a different set of recurrent states."""
import asyncio
import random

import pytest
import torch

from contract.checkpoint import load_checked_weights
from contract.model_config import ModelConfig
from fitness.reference import ReferenceModel
from serve.tokenizer import Tokenizer
from target import hf_checkpoints, toy_tokenizer
from tests.test_serve import async_client, reference_greedy, serving


# The hybrid served by two replicas of the engine behind the one endpoint (serve.replicas).
FLAGS = {"tiny_qwen3_moe": (), "tiny_qwen3_5_moe": ("--replicas", "2")}


@pytest.fixture(scope="module", params=list(FLAGS))
def target(tmp_path_factory, request):
    """(config.json, checkpoint dir with a byte-level tokenizer): vocab 512 fits one."""
    folder = hf_checkpoints.write(tmp_path_factory.mktemp("serve_moe"), request.param)
    toy_tokenizer.write(ModelConfig.load(folder).vocab_size, folder)
    return folder / "config.json", folder


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    yield from serving(target, tmp_path_factory.mktemp("moe"), "--max-num-seqs", "6", "--max-num-waiting", "50",
                       *FLAGS[target[1].name])


def test_greedy_completions_equal_the_reference_while_others_join_and_leave(server, target):
    config_path, folder = target
    config = ModelConfig.load(folder)
    reference = ReferenceModel(config, load_checked_weights(config, folder), "cpu")
    eos = Tokenizer(folder).eos_token_id
    served_model = config.model_type  # the name the server answers to
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 7, 30, 12, 50)]
    max_tokens = [10, 4, 14, 8, 6]

    async def greedy(openai, i):
        await asyncio.sleep(0.02 * i)  # each joins a batch already running
        response = await openai.completions.create(model=served_model, prompt=prompts[i], temperature=0,
                                                   max_tokens=max_tokens[i], extra_body={"return_token_ids": True})
        return response.choices[0].model_extra["token_ids"]

    async def sampled(openai, i):  # of different lengths: they leave at different steps
        await asyncio.sleep(0.01 * i)
        await openai.completions.create(model=served_model, prompt=[9 + i] * (4 * i + 1), max_tokens=6 + 5 * i,
                                        temperature=1.0, extra_body={"ignore_eos": True})

    async def churn():
        openai = async_client(server)
        return await asyncio.gather(*(greedy(openai, i) for i in range(len(prompts))),
                                    *(sampled(openai, i) for i in range(5)))

    served = asyncio.run(churn())[:len(prompts)]
    for prompt, limit, tokens in zip(prompts, max_tokens, served):
        assert tokens == reference_greedy(reference, prompt, limit, eos)
