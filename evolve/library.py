"""The library of recipes: the best programs known, each with what it was judged on.

A run's first generation takes the library's recipes that apply to its target, replayed
onto the seed and judged like any other program, and the run adds its winner to it, so
the next run starts from the best it knows. A recipe file (mutations/recipe.py's lines)
says what it was judged on in comment lines of the form `# key: value`, which a person
reads and `judged_on` parses:

    # device: cuda
    # machine: NVIDIA H100 80GB HBM3
    # structure: num_experts (the structural features its model had: the MoE, DeltaNet layers)
    # model: vocab_size=6000 hidden_size=768 ... (the config's shape, key=value)
    # dtype: float16
    # date: 2026-11-25
    # tokens_per_s: prefill=662000 decode=89500 mixed=271000
    # vs_seed: 20.92

The best of them is taken once more with its graph bounds fitted to the calls the run
times (decode batches past the recipe's largest captured decode graph): the recipes were
tuned on other targets' cases, and doubling a constant at a time would take a search
several generations to get there. Captured prefills are not fitted (evolve/README.md).

The repository ships mutations/recipes/; a run also reads its own library folder
(`--library`; by default `library/` beside history.csv), where its winner is written. Copy a file from
there to mutations/recipes/ to ship it.
"""
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import mutations
from contract.families import structural_features
from contract.model_config import ModelConfig, config_file
from fitness.cases import call_bounds, select_cases
from mutations import recipe, replay_cache
from mutations.rewrites.tune_constant import fitted_to

SHIPPED = Path(__file__).resolve().parent.parent / "mutations" / "recipes"
RECIPE = SHIPPED / "fastest.txt"
LIBRARY = "library"  # the operator named in history.csv for a program made from a recipe
SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings")
JUDGED_KEYS = ("device", "machine", "structure", "model", "dtype", "date", "tokens_per_s", "vs_seed", "run",
               "candidate")
# A recipe that names no structure was judged on a dense model (those written before the line was).
DENSE = "dense"
PAIRED_KEYS = ("model", "tokens_per_s")  # values written as key=value pairs
NUMBER_KEYS = ("vs_seed",)  # the other keys' values are text
JUDGED_LINE = re.compile(r"^#\s*([a-z_]+):\s*(.*?)\s*$")


@dataclass(frozen=True)
class Recipe:
    path: Path
    steps: tuple
    judged: dict  # judged_on(text)
    problem: str = ""  # why its lines do not parse, when they do not

    @property
    def name(self) -> str:
        return self.path.name

    def speed(self) -> float:
        """Geometric mean of the tokens/s it was judged at; 0 when none was recorded."""
        figures = [v for v in self.judged.get("tokens_per_s", {}).values() if v > 0]
        return math.exp(sum(map(math.log, figures)) / len(figures)) if figures else 0.0


@dataclass(frozen=True)
class RunTarget:
    """What a run judges on, in the terms a recipe records."""
    device: str  # "cpu" or "cuda"
    model: dict  # SHAPE_KEYS -> value
    dtype: str
    structure: str = DENSE  # structure_of its config

    @classmethod
    def of(cls, config) -> "RunTarget":
        """The shape as its file spells it (None where it is silent, as recipes record it); the
        dtype as the loader reads it (a config transformers 5 writes says `dtype`)."""
        raw = json.loads(config_file(config.model_config).read_text())
        model = ModelConfig.from_dict(raw)
        return cls(config.device, {k: raw.get(k) for k in SHAPE_KEYS}, model.torch_dtype, structure_of(model))

    def closeness(self, judged: dict) -> tuple:
        """How well a recipe's judgement matches this target: device, structure, shape, dtype.
        Structure before shape: for a Qwen3-MoE target on a GPU, four dense recipes (their
        recorded figures higher) were taken and qwen3_moe_by_hand.txt declined."""
        return (judged.get("device") == self.device, judged.get("structure", DENSE) == self.structure,
                judged.get("model") == self.model, judged.get("dtype") == self.dtype)


def structure_of(config) -> str:
    """The structural features `config` (a ModelConfig) has, by field name (contract.families:
    an MoE MLP, DeltaNet layers), or DENSE."""
    return " ".join(f.field for f in structural_features(config)) or DENSE


# --- reading and writing what a recipe was judged on -----------------------------------------

def judged_on(text: str) -> dict:
    """The `# key: value` lines of JUDGED_KEYS in a recipe's text."""
    judged = {}
    for line in text.splitlines():
        match = JUDGED_LINE.match(line)
        if match and match.group(1) in JUDGED_KEYS:
            key, value = match.groups()
            if key in PAIRED_KEYS:
                judged[key] = parse_pairs(value)
            else:  # ids stay text: a hash such as 59675999e6736123 reads as a float (inf)
                judged[key] = parse_value(value) if key in NUMBER_KEYS else value
    return judged


def parse_pairs(text: str) -> dict:
    return {key: parse_value(value) for key, _, value in (pair.partition("=") for pair in text.split())}


def parse_value(text: str):
    if text == "None":  # a shape key the config lacks (a Qwen3.5 has no dense intermediate_size)
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def judged_lines(judged: dict) -> list[str]:
    """`judged` as the comment lines `judged_on` reads, in JUDGED_KEYS order."""
    lines = []
    for key in JUDGED_KEYS:
        if key in judged:
            value = judged[key]
            text = " ".join(f"{k}={v}" for k, v in value.items()) if key in PAIRED_KEYS else value
            lines.append(f"# {key}: {text}")
    return lines


def read(path: Path) -> Recipe:
    text = Path(path).read_text()
    try:
        steps = tuple(recipe.parse(text))
    except recipe.RecipeError as err:
        return Recipe(Path(path), (), judged_on(text), str(err))
    return Recipe(Path(path), steps, judged_on(text))


def read_all(folders) -> list[Recipe]:
    """Every recipe (*.txt) in the folders that exist, by name within each, each folder once."""
    unique = {Path(f).resolve(): Path(f) for f in folders if Path(f).is_dir()}
    return [read(p) for folder in unique.values() for p in sorted(folder.glob("*.txt"))]


# --- the first generation ----------------------------------------------------------------------

def ranked(recipes: list, target: RunTarget) -> list:
    """Closest to the target first; among equals, the hand-kept recipe (RECIPE: what a run
    is measured against, so never ranked below recipes whose figures, recorded by other
    runs, read higher), then the fastest recorded, then the largest gain over the seed."""
    return sorted(recipes, key=lambda r: (target.closeness(r.judged), r.path.resolve() == RECIPE,
                                          r.speed(), r.judged.get("vs_seed", 0.0)), reverse=True)


def seed_programs(config, seed_source: str) -> tuple[list, list]:
    """([(source, operator args)], [(recipe name, why not)]): the programs of the library's
    best `library_top` recipes for this run's target and of the hand-kept recipe wherever
    it ranks (a bf16 run ranks bf16 recipes of other shapes above it, and the program a run
    is held to must be judged in it), the best once more fitted to the run's calls where
    that changes it (`fitted_program`), and every other recipe with the reason it was not
    taken (it needs a GPU, does not replay, repeats a program, or the best were taken)."""
    if not config.library:
        return [], []
    taken, declined, made = [], [], {seed_source: "the seed"}
    for entry in ranked(read_all(library_folders(config)), RunTarget.of(config)):
        why = why_not(entry, config, len(taken))
        if why is None:
            try:
                source = replay_cache.apply(list(entry.steps), seed_source)
            except recipe.RecipeError as err:
                why = f"does not replay on the seed: {err}"
            else:
                why = f"makes the same program as {made[source]}" if source in made else None
        if why is None:
            made[source] = entry.name
            taken.append((source, {"recipe": str(entry.path), "steps": [s.line() for s in entry.steps]}))
        else:
            declined.append((entry.name, why))
    fitted = fitted_program(taken[0], config) if taken else None
    if fitted is not None and fitted[0] not in made:
        taken.append(fitted)
    return taken, declined


def fitted_program(best: tuple, config) -> tuple | None:
    """(source, args) of the best library program with every constant that bounds a call
    (tune_constant's `fits:`) raised to hold the largest call of the cases this run times;
    None when it holds them already."""
    source, args = best
    bounds = call_bounds({**select_cases(config.bench), **select_cases(config.screen_bench)})
    moves = fitted_to(source, bounds)
    if not moves:
        return None
    steps = [recipe.RecipeStep("tune_constant", move) for move in moves]
    return replay_cache.apply(steps, source), {**args, "steps": [*args["steps"], *(s.line() for s in steps)]}


def why_not(entry: Recipe, config, num_taken: int) -> str | None:
    """Why `entry` is not replayed for this run before trying; None when it is."""
    if entry.problem:
        return f"does not parse: {entry.problem}"
    cuda_only = sorted({s.operator for s in entry.steps if is_cuda_only(s.operator)})
    if config.device == "cpu" and cuda_only:
        return f"needs a GPU: {cuda_only[0]} and {len(cuda_only) - 1} more of its steps run only on CUDA"
    if num_taken >= config.library_top and entry.path.resolve() != RECIPE:
        return f"the library's {config.library_top} best for this target are taken (--library-top)"
    return None


def is_cuda_only(operator: str) -> bool:
    try:
        return mutations.get_operator(operator).devices == "cuda"
    except KeyError:
        return False  # an unknown operator: replaying says so


def library_folders(config) -> tuple:
    return SHIPPED, config.library_dir


def steps_of(args: dict) -> list:
    """The recipe steps a library program's (or a stack's) operator args recorded."""
    return [recipe.parse_line(line, number) for number, line in enumerate(args.get("steps", []), start=1)]


# --- the winner --------------------------------------------------------------------------------

def add_winner(folder: Path, recipe_text: str, judged: dict) -> Path | None:
    """Write the winner's recipe with what it was judged on into `folder`; None when the
    library already holds those steps."""
    steps = [s.line() for s in recipe.parse(recipe_text)]
    for known in read_all([SHIPPED, folder]):
        if [s.line() for s in known.steps] == steps:
            return None
    date = judged.get("date") or time.strftime("%Y-%m-%d")
    path = Path(folder) / f"{judged.get('device', 'any')}_{date.replace('-', '')}_{judged['candidate'][:8]}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["# What it was judged on (evolve/library.py reads these lines):",
                               *judged_lines({**judged, "date": date})]) + "\n" + recipe_text)
    return path


def judged_as(target: RunTarget, machine: str, table: list, ratio: float, run_id: str, candidate: str) -> dict:
    """What a run's winner was judged on, from the final's table [(case, tokens/s, seed's)]."""
    return {"device": target.device, "machine": machine, "structure": target.structure, "model": target.model,
            "dtype": target.dtype, "tokens_per_s": {case: round(tps) for case, tps, _ in table},
            "vs_seed": round(ratio, 3), "run": run_id, "candidate": candidate}
