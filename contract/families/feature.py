"""A family feature: one config field the gate's `families` derived config turns on, unless
it is structural (it changes what a layer is, so no dense target's program is held to it)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    field: str  # the ModelConfig field
    name: str  # what a verdict calls it ("fails with the q/k norms (qk_norm)")
    off: object  # the field's value without the feature
    probe: object  # its value in the `families` derived config
    is_structural: bool = False  # only its own checkpoints have it: the `families` config leaves it off
