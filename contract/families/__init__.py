"""Model families, one module each, discovered: every module here but feature.py declares

  ORDER              its place: in the gate's feature order and toy weights' draws (a new
                     family takes the next free number, and no number ever moves)
  MODEL_TYPE         config.json's model_type (a Hugging Face family; dense.py, the
                     contract's own model, has none)
  FEATURE            the config field it brings, as the gate probes it (feature.Feature)
  TURNS_ON           the fields its config.json implies without saying them
  attention_weights  the tensors it adds to a layer's attention, by name and shape
  mlp_weights        (only a family whose layers may replace the dense MLP) the tensors of a
                     layer's MLP, or None where that layer keeps the dense one
  mixer_weights      (only a family whose layers may replace attention) the tensors that mix
                     a layer's tokens, or None where that layer attends
  ROTATED            tensors of its own whose rows are laid out per head for RoPE
  toy_weight         how toy weights draw a tensor of its own (None: as any other)
  settle_toy_weights (optional) what its toy weights must hold across tensors, set after
                     every draw
  REFERENCE          where its math is in fitness/reference.py
  SEED_GENES         the seed engine's genes that carry it (seed_engine/engine.py)

Adding a family: a module here, its config field in model_config.ModelConfig, its math in
fitness/reference.py, its genes in the seed (a new gene named in mutations/program.GENES),
and its alleles (tests/test_families.py checks the pointers).
"""
import importlib
import pkgutil


def discovered() -> list:
    """Every family module of this package, by ORDER."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "feature":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        order = getattr(module, "ORDER", None)
        if not isinstance(order, int) or order in found:
            raise TypeError(f"{module.__name__}.ORDER = {order!r}: each family needs its own integer "
                            f"(taken: {sorted(found)})")
        found[order] = module
    return [found[order] for order in sorted(found)]


LAYOUTS = tuple(discovered())  # the contract's dense layout first, then what each family adds
FAMILIES = {family.MODEL_TYPE: family for family in LAYOUTS if hasattr(family, "MODEL_TYPE")}
HF_FAMILIES = tuple(FAMILIES)
# Every family's feature: the gate's `families` config turns them all on (model_config.derived_configs).
FEATURES = tuple(family.FEATURE for family in LAYOUTS if not family.FEATURE.is_structural)
# Features that change what a layer is (an MoE MLP): only their own checkpoints have them.
STRUCTURAL = tuple(family.FEATURE for family in LAYOUTS if family.FEATURE.is_structural)
MLP_FAMILIES = tuple(family for family in LAYOUTS if hasattr(family, "mlp_weights"))
MIXER_FAMILIES = tuple(family for family in LAYOUTS if hasattr(family, "mixer_weights"))


# The seed gene of the dense SwiGLU (seed_engine/engine.py), which an MoE layer replaces.
DENSE_MLP_GENES = ("mlp",)


def idle_genes(config) -> frozenset:
    """The seed genes no timed call of `config`'s model (a ModelConfig) runs, whose swaps make
    programs as fast as their parent: those of every structural feature it lacks (the MoE genes
    on a dense model; no trace of the gate runs them either, its derived configs leaving
    structural features off), and the dense MLP's where no layer keeps it. The gate's dense
    derived configs still check that one, but every layer of Qwen3-30B-A3B is sparse, and a
    sweep there would spend a screen of 1.5-3 minutes on each of its swaps
    (docs/log/2026-11-30-moe-search-two-gpus-batch-1-timeline.md)."""
    idle = structural_genes(config, present=False)
    return idle if keeps_dense_mlp(config.to_dict()) else idle | frozenset(DENSE_MLP_GENES)


def keeps_dense_mlp(config: dict) -> bool:
    """Whether any layer of the model keeps the dense MLP (no family's replaces it there)."""
    return any(all(family.mlp_weights(config, "", layer) is None for family in MLP_FAMILIES)
               for layer in range(config["num_hidden_layers"]))


def own_genes(config) -> frozenset:
    """The seed genes of every structural feature `config` has (the MoE genes on an MoE model,
    the DeltaNet's on the hybrid): the seed writes them as the reference does (an expert at a
    time; the delta rule in torch's small ops), so they are where its time goes (4 layers of
    Qwen3-30B-A3B: the seed's batch-1 step 59x the hand-composed program's,
    docs/log/2026-11-28-moe-triton-alleles-first-gpu-figures.md)."""
    return structural_genes(config, present=True)


def structural_genes(config, present: bool) -> frozenset:
    """The seed genes of the structural features `config` has (`present`) or lacks."""
    has = structural_features(config)
    return frozenset(gene for family in LAYOUTS if family.FEATURE.is_structural
                     and (family.FEATURE in has) == present for gene in family.SEED_GENES)


def structural_features(config) -> tuple:
    """The structural features `config` (a ModelConfig) has, in STRUCTURAL's order."""
    return tuple(f for f in STRUCTURAL if getattr(config, f.field) != f.off)
