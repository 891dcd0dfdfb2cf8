"""A checkpoint on disk, read into the one layout the reference computes with.

Two formats come in. The contract's `model.pt` is that layout already. A Hugging Face
directory (`model.safetensors`, or shards named by `model.safetensors.index.json`) differs
in two ways, both undone here, once: its names carry a `model.` prefix, and its q/k rows
(and their biases and per-head norm weights) pair dimension i with i + head_dim/2 for
RoPE (rotate-half), where the layout pairs 2i with 2i + 1 (interleaved). Permuting the rows
of each head gives the same rotation and the same q.k, so one interleaved RoPE serves both
(gpt-fast's scripts/convert_hf_checkpoint.py undoes the same permutation). Where RoPE turns
part of each head (Qwen3.5), only that part's rows move.
"""
import json
from contextlib import contextmanager
from pathlib import Path

import torch

from contract.layout import ROTATED, contract_name, hf_name, weight_shapes
from contract.model_config import ConfigError, ModelConfig

CONTRACT_FILE = "model.pt"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"


def checkpoint_files(weight_dir) -> list:
    """The files the weights are read from (an index first, then its shards); ConfigError
    naming what is missing."""
    folder = Path(weight_dir)
    if (folder / CONTRACT_FILE).is_file():
        return [folder / CONTRACT_FILE]
    if (folder / SAFETENSORS_INDEX).is_file():
        shards = [folder / name for name in sorted(set(read_index(folder).values()))]
        missing = [shard.name for shard in shards if not shard.is_file()]
        if missing:
            raise ConfigError(f"{folder / SAFETENSORS_INDEX} names shards that are not there: {', '.join(missing)}")
        return [folder / SAFETENSORS_INDEX] + shards
    if (folder / SAFETENSORS_FILE).is_file():
        return [folder / SAFETENSORS_FILE]
    raise ConfigError(f"weights not found in {folder}: expected {CONTRACT_FILE}, {SAFETENSORS_FILE} "
                      f"or {SAFETENSORS_INDEX}")


def read_index(folder: Path) -> dict:
    """{tensor name: shard file name} of a sharded checkpoint."""
    try:
        return json.loads((folder / SAFETENSORS_INDEX).read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ConfigError(f"{folder / SAFETENSORS_INDEX} has no readable weight_map: {err!r}") from None


@contextmanager
def reading(path: Path):
    """A file that cannot be read as what its name says (a copy cut short: safetensors' or
    torch.load's own error, a traceback) as a ConfigError naming it."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"{path} cannot be read ({type(err).__name__}: {err}); was its copy cut short?") from None


def read_weights(weight_dir, config: ModelConfig) -> dict:
    """Every tensor of the checkpoint (CPU, as stored), in the contract's names and layout."""
    files = checkpoint_files(weight_dir)
    if files[0].name == CONTRACT_FILE:
        with reading(files[0]):
            return torch.load(files[0], map_location="cpu", weights_only=True)
    from safetensors.torch import load_file  # only a Hugging Face checkpoint needs it

    stored = {}
    for path in files:
        if path.suffix == ".safetensors":
            with reading(path):
                stored.update(load_file(path))
    return from_hf_layout(stored, config)


def from_hf_layout(stored: dict, config: ModelConfig) -> dict:
    """Hugging Face names and rotate-half rows -> the contract's names and interleaved rows."""
    weights = {}
    for stored_name, t in stored.items():
        name = contract_name(stored_name)
        if ROTATED.search(name):
            block, order = rope_row_order(name, config)
            if t.shape[0] % block:
                raise ConfigError(f"{stored_name} has {t.shape[0]} rows, not a whole number of heads")
            t = per_head_rows(t, block, order)
        weights[name] = t
    return weights


def to_hf_layout(weights: dict, config: ModelConfig) -> dict:
    """The contract's names and interleaved rows -> Hugging Face names and rotate-half rows
    (from_hf_layout undone: the judge writes its own weights as a target's checkpoint is)."""
    def undone(name, rows):
        block, order = rope_row_order(name, config)
        return per_head_rows(rows, block, order.argsort())

    return {hf_name(name): undone(name, t) if ROTATED.search(name) else t for name, t in weights.items()}


def rope_row_order(name: str, config: ModelConfig) -> tuple:
    """(rows per head, their order) that move a rotated tensor's rows from rotate-half to
    interleaved: within the first rotary_dim rows of each head's query or key, row
    i + rotary_dim/2 next to row i; the rest (dimensions RoPE leaves alone, a gated
    attention's gate rows after each head's query) stay where they are."""
    head_dim, rotary = config.head_dim, config.rotary_dim
    has_gate = config.attn_output_gate and ".q_proj." in name
    order = torch.arange(2 * head_dim if has_gate else head_dim)
    order[:rotary] = torch.arange(rotary).view(2, rotary // 2).T.reshape(-1)  # [0, half, 1, half + 1, ...]
    return len(order), order


def per_head_rows(rows: torch.Tensor, block: int, order: torch.Tensor) -> torch.Tensor:
    """Each head's `block` rows of `rows` [heads*block, ...] (or [block]) in `order`."""
    per_head = rows.reshape(-1, block, *rows.shape[1:])  # [heads, block, ...]
    return per_head[:, order].reshape(rows.shape)


def load_checked_weights(config: ModelConfig, weight_dir) -> dict:
    """The checkpoint in the contract's layout, every tensor checked against the config's
    shapes; a tied head is the embedding table itself, unless the checkpoint stores a head
    of its own anyway (transformers 5 then keeps that one)."""
    weights = read_weights(weight_dir, config)
    check_shapes({name: tuple(t.shape) for name, t in weights.items()}, config, weight_dir)
    if config.tie_word_embeddings:
        weights.setdefault("lm_head.weight", weights["embed_tokens.weight"])
    return weights


def check_weight_files(config: ModelConfig, weight_dir) -> None:
    """load_checked_weights' checks from the files' headers alone (a 65 GB checkpoint is
    not read into memory to be checked)."""
    files = checkpoint_files(weight_dir)
    if files[0].name == CONTRACT_FILE:
        with reading(files[0]):
            stored = torch.load(files[0], map_location="cpu", weights_only=True, mmap=True)
        check_shapes({name: tuple(t.shape) for name, t in stored.items()}, config, weight_dir)
        return
    from safetensors import safe_open

    shapes = {}
    for path in files:
        if path.suffix == ".safetensors":
            with reading(path), safe_open(path, "pt") as f:
                shapes.update({contract_name(name): tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    check_shapes(shapes, config, weight_dir)


def check_shapes(shapes: dict, config: ModelConfig, weight_dir) -> None:
    """ConfigError unless {contract name: shape} holds every tensor the config implies, in
    its shape, and no MLP tensor it does not."""
    expected = weight_shapes(config.to_dict())
    missing = sorted(set(expected) - set(shapes))
    if missing:
        raise ConfigError(f"{weight_dir} lacks {len(missing)} tensors, e.g. {missing[0]}")
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise ConfigError(f"{weight_dir}: {name} has shape {shapes[name]}, the config implies {shape}")
    # An MLP tensor the config does not name: more experts than it says, or experts where it has none.
    unexpected = sorted(name for name in shapes if ".mlp." in name and name not in expected)
    if unexpected:
        raise ConfigError(f"{weight_dir} stores {len(unexpected)} MLP tensors its config does not imply "
                          f"(num_experts {config.num_experts}), e.g. {unexpected[0]}")
