"""Random Hugging Face checkpoints of real shapes, made here (the machines reach no model
hub): config.json spelled as the Hub's checkpoints spell it (`torch_dtype`, `rope_theta`,
`rope_scaling`) and bf16 safetensors under Hugging Face's names, sharded with an index
past MAX_SHARD_BYTES, as `save_pretrained` does.

    python -m target.hf_checkpoints OUT [--only NAME ...] [--seed N] [--device cuda] [--overflow DIR]

writes OUT/NAME/ for each of
  llama_3_2_1b  Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 / 8 heads of 64,
                intermediate 8192, vocab 128256, tied, llama3 RoPE scaling (2.5 GB, two shards)
  qwen3_0_6b    Qwen3-0.6B's shape: hidden 1024, 28 layers, 16 / 8 heads of 128 (not
                1024 / 16), intermediate 3072, vocab 151936, tied, q/k norms (1.2 GB)
  tiny_qwen3    a Qwen3-style model small enough for `bash run.sh --model` on a CPU
  qwen3_30b_a3b Qwen3-30B-A3B's shape: hidden 2048, 48 layers, 32 / 4 heads of 128, 128
                experts of 768 (top 8, renormalised) in every layer, vocab 151936, untied
                (30.5 B parameters, 57 GiB: write it only where the disk has room)
  qwen3_30b_a3b_4_layers  the same width, 4 layers (5.8 GiB): beside transformers on one GPU
  tiny_qwen3_moe  a Qwen3-MoE small enough for a CPU: 8 experts of 64, top 2, a dense layer
  qwen3_5_35b_a3b Qwen3.5-35B-A3B's text model (seed 001's): hidden 2048, 40 layers, every
                4th attending (16 / 2 heads of 256, gated, RoPE on 64 dims), the rest Gated
                DeltaNet (16 key / 32 value heads of 128, conv of 4); 256 experts of 512 top 8
                and a shared expert of 512 in every layer; vocab 248320, untied
                (34.7 B parameters, 64.6 GiB: on a 64 GiB disk, --overflow a tmpfs; drawn
                with --device cuda in about a minute, 5 min 23 s on a CPU)
  qwen3_5_35b_a3b_4_layers  the same width, 4 layers (3 DeltaNet, 1 attending; 8.2 GiB)
  tiny_qwen3_5_moe  a Qwen3.5-MoE small enough for a CPU: 4 layers, 8 experts of 64, top 2

Shards are written one at a time, each drawn just before it is saved: the writer holds one
shard (MAX_SHARD_BYTES) in memory, not the model.

Every matrix is drawn with std 1/sqrt(fan_in) and every norm weight (q/k norms too) as
1 + N(0, 1/16): logits of order 1, where the gate sees a fault (the families' own 0.02
init leaves them near zero), and norm weights that differ per dimension, so that one read
in the wrong order shows. Then, for instance: bash run.sh --model OUT/tiny_qwen3
"""
import argparse
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from contract.layout import hf_name, weight_shapes
from contract.model_config import ModelConfig

MAX_SHARD_BYTES = 2 * 1024 ** 3
SPARE_BYTES = 2 * 1024 ** 3  # left free on OUT's disk when an overflow folder takes the rest
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "attention_bias": False,
    "mlp_bias": False, "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": True,
    "attention_bias": False, "use_sliding_window": False, "hidden_act": "silu", "bos_token_id": 151643,
    "eos_token_id": 151645,
}
# Head_dim 64 over 4 heads of a hidden 128: explicit, as Qwen3's is; a max_position_embeddings
# of 512 keeps the gate's longest prompt (min(max_position_embeddings, 1500)) cheap on a CPU.
TINY_QWEN3 = {**QWEN3_0_6B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
              "max_position_embeddings": 512, "bos_token_id": 0, "eos_token_id": 1}
# Qwen3's attention and config keys, experts in every layer's MLP.
QWEN3_30B_A3B = {**QWEN3_0_6B, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                 "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "tie_word_embeddings": False, "num_experts": 128, "num_experts_per_tok": 8,
                 "moe_intermediate_size": 768, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
TINY_QWEN3_MOE = {**QWEN3_30B_A3B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
                  "max_position_embeddings": 512, "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 64, "mlp_only_layers": [1], "bos_token_id": 0, "eos_token_id": 1}
# Written as save_pretrained writes Qwen3_5MoeForCausalLM (the text model alone, model_type
# qwen3_5_moe_text): the Hub's multimodal checkpoint nests it under text_config.
QWEN3_5_35B_A3B = {
    "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "torch_dtype": "bfloat16",
    "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "vocab_size": 248320, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(40)],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "bos_token_id": 248044,
    "eos_token_id": 248044,
}
TINY_QWEN3_5_MOE = {**QWEN3_5_35B_A3B, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 512,
                    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_key_head_dim": 32,
                    "linear_value_head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                    "shared_expert_intermediate_size": 64, "bos_token_id": 0, "eos_token_id": 1}
CHECKPOINTS = {"llama_3_2_1b": LLAMA_3_2_1B, "qwen3_0_6b": QWEN3_0_6B, "tiny_qwen3": TINY_QWEN3,
               "qwen3_30b_a3b": QWEN3_30B_A3B, "qwen3_30b_a3b_4_layers": {**QWEN3_30B_A3B, "num_hidden_layers": 4},
               "tiny_qwen3_moe": TINY_QWEN3_MOE, "qwen3_5_35b_a3b": QWEN3_5_35B_A3B,
               "qwen3_5_35b_a3b_4_layers": {**QWEN3_5_35B_A3B, "num_hidden_layers": 4,
                                            "layer_types": QWEN3_5_35B_A3B["layer_types"][:4]},
               "tiny_qwen3_5_moe": TINY_QWEN3_5_MOE}
BF16_BYTES = 2


def hf_shapes(config: dict) -> dict:
    """{Hugging Face name: shape} of every tensor the config implies, in the draw order."""
    return {hf_name(name): shape for name, shape in weight_shapes(ModelConfig.from_dict(config).to_dict()).items()}


def draw(shape: tuple, generator) -> torch.Tensor:
    """A bf16 tensor on the CPU, drawn on the generator's device: 1 + N(0, 1/16) for a norm
    weight, N(0, 1/fan_in) for a matrix."""
    noise = torch.randn(shape, generator=generator, device=generator.device)
    if len(shape) == 1:
        return (1 + noise / 4).to(torch.bfloat16).cpu()
    return (noise / math.sqrt(math.prod(shape[1:]))).to(torch.bfloat16).cpu()  # a conv: its taps


def shards(sizes: dict) -> list:
    """Consecutive groups of names of at most MAX_SHARD_BYTES each ({name: bytes}; one tensor
    may exceed it)."""
    groups, size = [[]], 0
    for name, nbytes in sizes.items():
        if groups[-1] and size + nbytes > MAX_SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def write(out: Path, name: str, seed: int = 0, device: str = "cpu", overflow: Path | None = None) -> Path:
    """OUT/name: its config.json and safetensors, each shard drawn (on `device`: the same
    seed draws other weights on a GPU) just before it is saved; the directory. A shard that
    would leave OUT's disk less than SPARE_BYTES free goes to overflow/name, linked from
    OUT/name (Qwen3.5-35B-A3B's 64.6 GiB on a 64 GiB disk, the rest in memory)."""
    config = CHECKPOINTS[name]
    folder = Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    shapes = hf_shapes(config)
    groups = shards({n: math.prod(shape) * BF16_BYTES for n, shape in shapes.items()})
    generator = torch.Generator(device).manual_seed(seed)
    files = ["model.safetensors"] if len(groups) == 1 else \
        [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)]
    for file, group in zip(files, groups):
        tensors = {n: draw(shapes[n], generator) for n in group}
        (folder / file).unlink(missing_ok=True)
        target = folder / file
        if overflow and shutil.disk_usage(folder).free < sum(t.nbytes for t in tensors.values()) + SPARE_BYTES:
            target = (Path(overflow) / name / file).resolve()
            target.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, target, metadata={"format": "pt"})
        if target != folder / file:
            (folder / file).symlink_to(target)
    if len(groups) > 1:
        total = sum(math.prod(shape) * BF16_BYTES for shape in shapes.values())
        weight_map = {n: file for file, group in zip(files, groups) for n in group}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", choices=sorted(CHECKPOINTS), action="append")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the weights are drawn (cuda: faster; other weights)")
    parser.add_argument("--overflow", type=Path, help="a folder (a tmpfs) for the shards OUT's disk cannot hold")
    args = parser.parse_args(argv)
    for name in args.only or CHECKPOINTS:
        print(write(args.out, name, args.seed, args.device, args.overflow))


if __name__ == "__main__":
    main()
