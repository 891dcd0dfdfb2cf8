"""A real tokenizer for a toy target: byte-level BPE of exactly the model's vocab_size.

Trained with the `tokenizers` library on a corpus of pseudo-words drawn from a seeded
RNG, so the same config always gives the same tokenizer, made locally in seconds. It is
written the way a Hugging Face model ships one: `tokenizer.json` (the BPE) and
`tokenizer_config.json` (special tokens and a ChatML chat template), so the server reads
the toy target exactly as it reads a real model.

    python -m target.toy_tokenizer [--config C] [--output DIR] [--seed 1234]
"""
import argparse
import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
DEFAULT_SEED = 1234
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + list("aeiou")
# BPE merges within words: as many distinct words as tokens wanted (pieces of words make
# up the rest), each seen about five times.
MIN_WORDS = 2_000


def default_dir(vocab_size: int) -> Path:
    """Where a toy target's tokenizer is generated (inside the gitignored weights folder)."""
    return HERE / "weights" / f"tokenizer-{vocab_size}"


def corpus(vocab_size: int, seed: int) -> list[str]:
    """Sentences of pseudo-words, with digits and punctuation, from a seeded RNG."""
    rng = random.Random(seed)
    num_words = max(vocab_size, MIN_WORDS)
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 5))) for _ in range(num_words)]
    marks = [".", ",", "?", "!", ":", " 42", " 7", " 2026"]
    return [" ".join(rng.choices(words, k=rng.randint(4, 16))) + rng.choice(marks)
            for _ in range(num_words // 2)]


def train(vocab_size: int, seed: int = DEFAULT_SEED) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus(vocab_size, seed), trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(f"trained {tokenizer.get_vocab_size()} tokens, the model has "
                         f"vocab_size {vocab_size}")
    return tokenizer


def write(vocab_size: int, output: Path, seed: int = DEFAULT_SEED) -> Path:
    """tokenizer.json and tokenizer_config.json in `output`; the config is written last,
    so a folder with both files is complete."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    train(vocab_size, seed).save(str(output / "tokenizer.json"))
    config = {"eos_token": EOS_TOKEN, "bos_token": None, "chat_template": CHAT_TEMPLATE,
              "model_max_length": None}
    (output / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return output


def ensure(config_path, output=None, seed: int = DEFAULT_SEED) -> Path:
    """The toy tokenizer for the model config at `config_path`, generated unless present."""
    vocab_size = json.loads(Path(config_path).read_text())["vocab_size"]
    output = Path(output) if output else default_dir(vocab_size)
    if not (output / "tokenizer_config.json").exists():
        write(vocab_size, output, seed)
    return output


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=HERE / "model_config.json")
    parser.add_argument("--output", type=Path, help="default: target/weights/tokenizer-VOCAB")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    vocab_size = json.loads(args.config.read_text())["vocab_size"]
    path = write(vocab_size, args.output or default_dir(vocab_size), args.seed)
    print(f"wrote {path} ({vocab_size} tokens, seed {args.seed})")


if __name__ == "__main__":
    main()
