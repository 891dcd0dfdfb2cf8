"""The model config: read, validated with messages, defaults in one place, never changed.

Two formats come in: the contract's model_config.json, and a Hugging Face config.json
(its model_type one of the families in contract/families/, as `transformers` writes it).
Both become one ModelConfig, whose features (q/k/v biases, per-head q/k norms, tied
embeddings, llama3 RoPE frequencies, mixture-of-experts MLPs) are explicit fields.

Also the derived configs the gate judges a candidate on (GQA, the other GPU dtype, another
head_dim, more layers, every family's feature), each small enough to judge in seconds.
"""
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from contract.devices import is_cuda
from contract.families import FAMILIES, FEATURES, HF_FAMILIES, qwen3_5_moe
from contract.families.llama import LLAMA3_KEYS
from contract.families.qwen3_moe import is_sparse_layer

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
    model_type: str = "tiny_llama"
    # The families' features (contract/families/), each off by default.
    qkv_bias: bool = False  # biases on q, k and v (qwen2)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (qwen3)
    tie_word_embeddings: bool = False  # the output head is the embedding table (dense)
    rope_scaling: dict | None = None  # llama3 frequency rule: rope_type and LLAMA3_KEYS (llama)
    # Mixture-of-experts MLPs (qwen3_moe), structural: num_experts 0 leaves every layer dense.
    num_experts: int = 0  # experts in each sparse layer
    num_experts_per_tok: int = 0  # the top-k the router picks per token
    norm_topk_prob: bool = False  # the top-k probabilities renormalised to sum to 1
    moe_intermediate_size: int = 0  # each expert's SwiGLU width
    decoder_sparse_step: int = 1  # every step-th layer is sparse...
    mlp_only_layers: tuple = ()  # ...but these, dense
    shared_expert_intermediate_size: int = 0  # a shared expert beside the routed ones, gated (qwen3_5_moe)
    # Qwen3.5's hybrid (qwen3_5_moe), structural: no layer_types, every layer attends.
    layer_types: tuple = ()  # per layer, "linear_attention" (a Gated DeltaNet) or "full_attention"
    linear_num_key_heads: int = 0  # the DeltaNet's q and k heads...
    linear_num_value_heads: int = 0  # ...and v heads (each k head serves a run of them)
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0  # the causal conv's taps
    attn_output_gate: bool = False  # q_proj also gives a sigmoid gate on attention's output
    partial_rotary_factor: float = 1.0  # RoPE turns each head's first head_dim * this dimensions
    zero_centred_norm: bool = False  # RMSNorm scales by 1 + weight, in fp32, before the cast

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
        if self.rope_scaling is not None:
            check_llama3(self.rope_scaling)
        for key in ("mlp_only_layers", "layer_types"):  # JSON gives lists
            object.__setattr__(self, key, tuple(self.__dict__[key]))
        if self.num_experts:
            check_experts(self)
        if self.layer_types:
            problems = qwen3_5_moe.check(self)
            if problems:
                raise ConfigError("; ".join(problems))
        rotary = self.head_dim * self.partial_rotary_factor
        if not (0 < rotary <= self.head_dim and rotary == int(rotary) and int(rotary) % 2 == 0):
            raise ConfigError(f"partial_rotary_factor {self.partial_rotary_factor!r} of head_dim {self.head_dim} "
                              f"must turn an even number of dimensions")

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        """A contract config, or a Hugging Face one (by its model_type)."""
        if raw.get("model_type") in HF_FAMILIES:
            raw = hf_fields(raw)
        elif "architectures" in raw:
            raise ConfigError(f"model_type {raw.get('model_type')!r} is not supported: "
                              f"Hugging Face checkpoints of {', '.join(HF_FAMILIES)} are")
        missing = [k for k in REQUIRED_KEYS if k not in raw]
        if missing:
            raise ConfigError(f"model config lacks {', '.join(missing)}")
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw and raw[k] is not None}
        return cls(**known)

    @classmethod
    def load(cls, path) -> "ModelConfig":
        """From a config file, or a Hugging Face model directory (its config.json)."""
        path = config_file(path)
        if not path.is_file():
            raise ConfigError(f"model config not found: {path}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from None
        return cls.from_dict(raw)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @property
    def is_hf(self) -> bool:
        return self.model_type in HF_FAMILIES

    def compute_dtype(self, device: str) -> torch.dtype:
        """The reference's rule: fp32 on CPU; on CUDA bf16 if asked, otherwise fp16."""
        if not is_cuda(device):
            return torch.float32
        return torch.bfloat16 if self.torch_dtype.lower() in BF16_NAMES else torch.float16

    def derive(self, **changes) -> "ModelConfig":
        return replace(self, **changes)

    def is_sparse_layer(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is a mixture of experts."""
        return is_sparse_layer(vars(self), layer)

    def is_linear_layer(self, layer: int) -> bool:
        """Whether layer `layer` mixes tokens with a Gated DeltaNet rather than attention."""
        return qwen3_5_moe.is_linear_layer(vars(self), layer)

    @property
    def num_attention_layers(self) -> int:
        """Layers that attend, and so keep K/V (all but a hybrid's DeltaNet layers)."""
        return sum(not self.is_linear_layer(i) for i in range(self.num_hidden_layers))

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head RoPE turns (the first ones)."""
        return int(self.head_dim * self.partial_rotary_factor)


def config_file(path) -> Path:
    """The config file `path` names: itself, or a Hugging Face model directory's config.json."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def check_experts(config: ModelConfig) -> None:
    sizes = {k: getattr(config, k) for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                             "decoder_sparse_step")}
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad:
        raise ConfigError(f"a mixture of experts needs positive integers, got {bad}")
    if config.num_experts_per_tok > config.num_experts:
        raise ConfigError(f"num_experts_per_tok ({config.num_experts_per_tok}) exceeds num_experts "
                          f"({config.num_experts})")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in config.mlp_only_layers):
        raise ConfigError(f"mlp_only_layers must be layer indices, got {list(config.mlp_only_layers)}")


def hf_fields(raw: dict) -> dict:
    """A transformers config.json in this config's fields: head_dim and KV heads made
    explicit, the dtype and RoPE read from either spelling, the family's features set."""
    family = raw["model_type"]
    unsupported = [key for key in ("mlp_bias", "use_sliding_window") if raw.get(key)]
    if raw.get("attention_bias"):
        unsupported.append("attention_bias (it puts a bias on o_proj too)")
    if unsupported:
        raise ConfigError(f"{family} config asks for what no engine here serves: {', '.join(unsupported)}")
    theta, scaling = hf_rope(raw)
    heads = raw.get("num_attention_heads")
    # A feature switched on by its own key in any family's config, or implied by the family.
    switches = {f.field: bool(raw.get(f.field)) for f in FEATURES if f.off is False} | FAMILIES[family].TURNS_ON
    fields = dict(raw, rope_theta=theta, rope_scaling=scaling,
                  torch_dtype=raw.get("dtype") or raw.get("torch_dtype") or "float32", **switches)
    fields.pop("layer_types", None)  # Qwen2's and Qwen3's list sliding windows: a hybrid's own hf_fields reads its
    if hasattr(FAMILIES[family], "hf_fields"):  # keys of its own, or spelled its own way
        fields.update(FAMILIES[family].hf_fields(raw))
    if isinstance(heads, int) and heads > 0:  # else the config's own check says what is wrong
        fields["num_key_value_heads"] = raw.get("num_key_value_heads") or heads
        if raw.get("head_dim") is None and isinstance(raw.get("hidden_size"), int):
            fields["head_dim"] = raw["hidden_size"] // heads
    return fields


def hf_rope(raw: dict) -> tuple:
    """(theta, llama3 scaling or None) from `rope_parameters` (transformers 5) or
    `rope_theta` and `rope_scaling` (before it)."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = params.get("rope_theta") or raw.get("rope_theta") or DEFAULTS["rope_theta"]
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ConfigError(f"RoPE type {kind!r} is not supported (default and llama3 are)")
    return theta, {"rope_type": "llama3", **{k: params.get(k) for k in LLAMA3_KEYS}}


def check_llama3(scaling: dict) -> None:
    if scaling.get("rope_type") != "llama3":
        raise ConfigError(f"rope_scaling must be the llama3 rule, got {scaling!r}")
    bad = [k for k in LLAMA3_KEYS if not isinstance(scaling.get(k), (int, float)) or not scaling[k] > 0]
    if bad or not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ConfigError(f"llama3 rope_scaling needs positive {', '.join(LLAMA3_KEYS)} with "
                          f"high_freq_factor > low_freq_factor, got {scaling!r}")


def derived_configs(base: ModelConfig, small: bool = True) -> dict[str, ModelConfig]:
    """Configs a candidate was not tuned on. `small` shrinks them so judging stays cheap."""
    if small:
        layers = min(base.num_hidden_layers, 2)
        # A hybrid's have both kinds of layer, whatever their depth.
        hybrid = {"layer_types": qwen3_5_moe.derived_layer_types(layers)} if base.layer_types else {}
        base = base.derive(vocab_size=min(base.vocab_size, 512),
                           intermediate_size=min(base.intermediate_size, 4 * 128), num_hidden_layers=layers,
                           max_position_embeddings=min(base.max_position_embeddings, 512), **hybrid)
        if base.num_experts:  # 16 experts of 512 keep a judgement cheap; top-k as the target's
            experts = min(base.num_experts, 16)
            base = base.derive(num_experts=experts, num_experts_per_tok=min(base.num_experts_per_tok, experts),
                               moe_intermediate_size=min(base.moe_intermediate_size, 4 * 128),
                               shared_expert_intermediate_size=min(base.shared_expert_intermediate_size, 4 * 128))
    heads = base.num_attention_heads
    # Two KV heads at least: with one, a wrong head mapping (repeat for repeat_interleave)
    # gives the same answer and slips through.
    gqa_heads = max(8, heads - heads % 4)
    other_dim = 64 if base.head_dim != 64 else 128
    # The other GPU dtype: a bf16 target is held to fp16 too, whose 10 mantissa bits show what
    # bf16's 7 hide (a hybrid's decay or write strength a tenth off).
    dtype_label, other_dtype = ("fp16", "float16") if base.torch_dtype.lower() in BF16_NAMES else ("bf16", "bfloat16")
    return {
        "gqa": base.derive(num_attention_heads=gqa_heads, num_key_value_heads=gqa_heads // 4,
                           hidden_size=gqa_heads * base.head_dim),
        dtype_label: base.derive(torch_dtype=other_dtype),
        "head_dim": base.derive(head_dim=other_dim, hidden_size=heads * other_dim),
        "deeper": base.derive(num_hidden_layers=base.num_hidden_layers + 2,
                              **({"layer_types": base.layer_types + base.layer_types[-2:]} if base.layer_types else {})),
        "head_dim_256": base.derive(head_dim=256, num_attention_heads=2, num_key_value_heads=1,
                                    hidden_size=512),
        # Every family's feature at once, each a fault of its own when missed: biases and
        # per-head norms drawn at random, a tied head, llama3 frequencies.
        "families": base.derive(**{feature.field: feature.probe for feature in FEATURES}),
    }
