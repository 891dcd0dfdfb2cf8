"""The model config: read, validated with messages, defaults in one place, never changed.

Also the derived configs the gate judges a candidate on (GQA, bf16, another head_dim,
more layers), each small enough to judge in seconds.
"""
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from target.toy_weights import weight_shapes

REQUIRED_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim",
)
DEFAULTS = {"torch_dtype": "float16", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 4096}
BF16_NAMES = ("bfloat16", "bf16")


class ConfigError(ValueError):
    """A model config or weights file that cannot be judged; the message says why."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    torch_dtype: str = DEFAULTS["torch_dtype"]
    rms_norm_eps: float = DEFAULTS["rms_norm_eps"]
    rope_theta: float = DEFAULTS["rope_theta"]
    max_position_embeddings: int = DEFAULTS["max_position_embeddings"]

    def __post_init__(self):
        for key in REQUIRED_KEYS + ("max_position_embeddings",):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{key} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE pairs, got {self.head_dim}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ConfigError(f"rms_norm_eps and rope_theta must be > 0, got "
                              f"{self.rms_norm_eps!r} and {self.rope_theta!r}")

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        missing = [k for k in REQUIRED_KEYS if k not in raw]
        if missing:
            raise ConfigError(f"model config lacks {', '.join(missing)}")
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw and raw[k] is not None}
        return cls(**known)

    @classmethod
    def load(cls, path) -> "ModelConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"model config not found: {path}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from None
        return cls.from_dict(raw)

    def to_dict(self) -> dict:
        return {"model_type": "tiny_llama", **self.__dict__}

    def compute_dtype(self, device: str) -> torch.dtype:
        """The reference's rule: fp32 on CPU; on CUDA bf16 if asked, otherwise fp16."""
        if not str(device).startswith("cuda"):
            return torch.float32
        return torch.bfloat16 if self.torch_dtype.lower() in BF16_NAMES else torch.float16

    def derive(self, **changes) -> "ModelConfig":
        return replace(self, **changes)


def load_checked_weights(config: ModelConfig, weight_dir) -> dict:
    """Load `weight_dir/model.pt` and check every tensor against the config's shapes."""
    path = Path(weight_dir) / "model.pt"
    if not path.is_file():
        raise ConfigError(f"weights not found: {path}")
    weights = torch.load(path, map_location="cpu", weights_only=True)
    expected = weight_shapes(config.to_dict())
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ConfigError(f"{path} lacks {len(missing)} tensors, e.g. {missing[0]}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ConfigError(f"{path}: {name} has shape {tuple(weights[name].shape)}, "
                              f"the config implies {shape}")
    return weights


def derived_configs(base: ModelConfig, small: bool = True) -> dict[str, ModelConfig]:
    """Configs a candidate was not tuned on. `small` shrinks them so judging stays cheap."""
    if small:
        base = base.derive(vocab_size=min(base.vocab_size, 512),
                           intermediate_size=min(base.intermediate_size, 4 * 128),
                           num_hidden_layers=min(base.num_hidden_layers, 2),
                           max_position_embeddings=min(base.max_position_embeddings, 512))
    heads = base.num_attention_heads
    # Two KV heads at least: with one, a wrong head mapping (repeat for repeat_interleave)
    # gives the same answer and slips through.
    gqa_heads = max(8, heads - heads % 4)
    other_dim = 64 if base.head_dim != 64 else 128
    return {
        "gqa": base.derive(num_attention_heads=gqa_heads, num_key_value_heads=gqa_heads // 4,
                           hidden_size=gqa_heads * base.head_dim),
        "bf16": base.derive(torch_dtype="bfloat16"),
        "head_dim": base.derive(head_dim=other_dim, hidden_size=heads * other_dim),
        "deeper": base.derive(num_hidden_layers=base.num_hidden_layers + 2),
        "head_dim_256": base.derive(head_dim=256, num_attention_heads=2, num_key_value_heads=1,
                                    hidden_size=512),
    }
