"""Model families, one module each. A family module declares:

  MODEL_TYPE         config.json's model_type (a Hugging Face family)
  FEATURE            the config field it brings, as the gate probes it (feature.Feature)
  TURNS_ON           the fields its config.json implies without saying them
  attention_weights  the tensors it adds to a layer's attention, by name and shape
  ROTATED            tensors of its own whose rows are laid out per head for RoPE
  REFERENCE          where its math is in fitness/reference.py
  SEED_GENES         the seed engine's genes that carry it (seed_engine/engine.py)

Adding a family: a module here, its name in FAMILIES, its config field in
model_config.ModelConfig, its math in fitness/reference.py and its genes in the seed.
"""
from contract.families import dense, llama, qwen2, qwen3

# In the order the gate tries their features alone, and toy weights draw their tensors.
FAMILIES = {family.MODEL_TYPE: family for family in (qwen2, qwen3, llama)}
HF_FAMILIES = tuple(FAMILIES)
# Every family's feature, the contract's tied head first: the gate's `families` config
# turns them all on (model_config.derived_configs).
FEATURES = (dense.FEATURE,) + tuple(family.FEATURE for family in FAMILIES.values())
LAYOUTS = (dense,) + tuple(FAMILIES.values())  # what adds to the contract's weight layout
