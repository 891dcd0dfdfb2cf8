"""Requests and responses in the OpenAI API's shapes (pydantic models).

Unknown request fields are ignored, as OpenAI-compatible servers do; a field out of its
range fails validation, and the app answers 400 naming it.
"""
import time
import uuid
from typing import Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationInfo,
                      field_validator)

from serve.sampling import SamplingParams

MAX_STOP_STRINGS = 4
MAX_SEED = 2**63 - 1
MAX_TOP_K = 2**31 - 1  # more than any vocabulary, and within the int64 tensor sampling uses
MAX_N = 128  # samples of one prompt (n, best_of), as OpenAI's n
MAX_LOGPROBS = 20  # top log-probabilities per token, vLLM's default limit and OpenAI chat's


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(Request):
    include_usage: bool = False


class SamplingFields(Request):
    """What both endpoints share: the model, sampling, stopping and streaming."""
    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=MAX_TOP_K, description="0 or -1: no top-k")
    seed: Optional[int] = Field(None, ge=0, le=MAX_SEED)
    stop: Union[StrictStr, list[StrictStr], None] = Field(None, validate_default=True)
    n: int = Field(1, ge=1, le=MAX_N, description="choices per prompt")
    stream: bool = False
    best_of: Optional[int] = Field(None, ge=1, le=MAX_N, description="samples the n choices are the best of")
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False  # vLLM's extension, so a benchmark gets its full length
    return_token_ids: bool = False  # vLLM's extension: each choice's token ids
    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs show "token_id:ID", not text

    @field_validator("stop")
    @classmethod
    def as_list(cls, stop) -> list:
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stop) > MAX_STOP_STRINGS or not all(stop):
            raise ValueError(f"at most {MAX_STOP_STRINGS} non-empty strings")
        return stop

    @field_validator("best_of")
    @classmethod
    def at_least_n_and_not_streamed(cls, best_of, info: ValidationInfo):
        n = info.data.get("n", 1)
        if best_of is not None and best_of < n:
            raise ValueError(f"must be at least n ({n}), got {best_of}")
        if best_of is not None and best_of > n and info.data.get("stream"):
            raise ValueError("cannot be streamed: the best are known only once all have finished")
        return best_of

    @property
    def num_samples(self) -> int:
        """Sequences per prompt: best_of, of which the n best are answered."""
        return self.best_of or self.n

    @property
    def num_logprobs(self) -> Optional[int]:
        """Top log-probabilities per token asked for (0: only the sampled token's), or None."""
        raise NotImplementedError

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        logprobs = self.num_logprobs
        if logprobs is None and self.num_samples > self.n:
            logprobs = 0  # best_of ranks the samples by their log-probabilities
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              top_k=max(self.top_k, 0), seed=self.seed, max_tokens=max_tokens,
                              stop=tuple(self.stop), ignore_eos=self.ignore_eos, logprobs=logprobs)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    # A text, texts (one choice each), token ids, or lists of token ids.
    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    max_tokens: Optional[int] = Field(16, ge=1)
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)

    def requested_max_tokens(self) -> Optional[int]:
        return self.max_tokens

    @property
    def num_logprobs(self) -> Optional[int]:
        return self.logprobs


class TextPart(Request):
    type: Literal["text"]
    text: str


class ChatMessage(Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)

    @field_validator("top_logprobs")
    @classmethod
    def needs_logprobs(cls, top_logprobs, info: ValidationInfo):
        if top_logprobs and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return top_logprobs

    def requested_max_tokens(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> Optional[int]:
        return (self.top_logprobs or 0) if self.logprobs else None


# Responses.

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """The legacy API's parallel lists, one entry per token."""
    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]  # the top k and the sampled token


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[Literal["stop", "length"]] = None
    token_ids: Optional[list[int]] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]  # the token's text in UTF-8


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[Literal["stop", "length"]] = None
    token_ids: Optional[list[int]] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[Literal["stop", "length"]] = None
    token_ids: Optional[list[int]] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "engine-evolver"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorBody
