"""A model's tokenizer as it ships: tokenizer.json (read by the `tokenizers` library) and
tokenizer_config.json (special tokens and the jinja2 chat template)."""
import json
from pathlib import Path
from typing import Optional

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as BackendTokenizer

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers before 0.21: StreamDecoder does it in Python
    DecodeStream = None

# Hugging Face renders chat templates with these options; templates are written for them.
TEMPLATE_OPTIONS = {"trim_blocks": True, "lstrip_blocks": True}


def raise_exception(message):
    raise TemplateError(message)


def token_content(token) -> Optional[str]:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    return token.get("content") if isinstance(token, dict) else token


def default_template(template):
    """The chat template: a string, or a list of named ones of which "default" is used."""
    if isinstance(template, list):
        named = {t["name"]: t["template"] for t in template}
        return named.get("default")
    return template


class Tokenizer:
    def __init__(self, directory):
        directory = Path(directory)
        self.backend = BackendTokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.eos_token = token_content(config.get("eos_token"))
        self.bos_token = token_content(config.get("bos_token"))
        self.eos_token_id = self.backend.token_to_id(self.eos_token) if self.eos_token else None
        template = default_template(config.get("chat_template"))
        self.chat_template = self.compile(template) if template else None
        self.token_texts = {}  # token_text's, as they are looked up

    @staticmethod
    def compile(template: str):
        environment = ImmutableSandboxedEnvironment(**TEMPLATE_OPTIONS)
        environment.globals["raise_exception"] = raise_exception
        return environment.from_string(template)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=True)

    def stream_decoder(self):
        """A decoder of one growing sequence's text: tokenizers' own when it has one."""
        return FastStreamDecoder(self) if DecodeStream is not None else StreamDecoder(self)

    def token_text(self, token_id: int) -> str:
        """One token's own text, special tokens included, as vLLM shows a token with its
        log-probability (a token holding part of a character shows U+FFFD)."""
        text = self.token_texts.get(token_id)
        if text is None:
            text = self.token_texts[token_id] = self.backend.decode([token_id], skip_special_tokens=False)
        return text

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """The prompt's token ids: the messages rendered, then a generation prompt."""
        if self.chat_template is None:
            raise ValueError("the model's tokenizer_config.json has no chat_template")
        text = self.chat_template.render(messages=messages, add_generation_prompt=True,
                                         bos_token=self.bos_token or "",
                                         eos_token=self.eos_token or "")
        # The template already wrote every special token the model expects.
        return self.encode(text, add_special_tokens=False)


class StreamDecoder:
    """Text of a growing list of token ids, handed out as it becomes final.

    A token can end in the middle of a character (byte-level BPE): the text of the
    tokens since `prefix_offset` is decoded again each step, and only what it adds past
    `read_offset`, once it no longer ends in a replacement character, is handed out.
    (The offsets of Hugging Face's text-generation-inference and vLLM.)
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.prefix_offset = 0
        self.read_offset = 0

    def step(self, token_ids: list, is_last: bool = False) -> str:
        """The new text after `token_ids` (all so far) grew; all of it when `is_last`."""
        seen = self.tokenizer.decode(token_ids[self.prefix_offset:self.read_offset])
        text = self.tokenizer.decode(token_ids[self.prefix_offset:])
        if len(text) <= len(seen) or (text.endswith("\ufffd") and not is_last):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
        return text[len(seen):]


class FastStreamDecoder:
    """StreamDecoder's text by tokenizers' DecodeStream, which keeps the same offsets in Rust:
    one call per token instead of two decodes of Python lists (half the time a token)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.stream = DecodeStream(skip_special_tokens=True)
        self.num_tokens = 0  # of token_ids fed to the stream
        self.num_chars = 0  # of text handed out

    def step(self, token_ids: list, is_last: bool = False) -> str:
        """The new text after `token_ids` (all so far) grew; all of it when `is_last`."""
        pieces = [self.stream.step(self.tokenizer.backend, t) for t in token_ids[self.num_tokens:]]
        self.num_tokens = len(token_ids)
        text = "".join(p for p in pieces if p)
        if is_last:  # a character cut at the end, which the stream holds back, as a whole decode shows it
            text += self.tokenizer.decode(token_ids)[self.num_chars + len(text):]
        self.num_chars += len(text)
        return text
