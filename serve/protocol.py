"""Requests and responses in the OpenAI API's shapes (pydantic models).

Unknown request fields are ignored, as OpenAI-compatible servers do; a field out of its
range fails validation, and the app answers 400 naming it.
"""
import time
import uuid
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from serve.sampling import SamplingParams

MAX_STOP_STRINGS = 4
MAX_SEED = 2**63 - 1
MAX_TOP_K = 2**31 - 1  # more than any vocabulary, and within the int64 tensor sampling uses


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
    n: int = Field(1, ge=1, le=1, description="one choice per prompt")
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False  # vLLM's extension, so a benchmark gets its full length
    return_token_ids: bool = False  # vLLM's extension: each choice's token ids

    @field_validator("stop")
    @classmethod
    def as_list(cls, stop) -> list:
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stop) > MAX_STOP_STRINGS or not all(stop):
            raise ValueError(f"at most {MAX_STOP_STRINGS} non-empty strings")
        return stop

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              top_k=max(self.top_k, 0), seed=self.seed, max_tokens=max_tokens,
                              stop=tuple(self.stop), ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    # A text, texts (one choice each), token ids, or lists of token ids.
    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    max_tokens: Optional[int] = Field(16, ge=1)

    def requested_max_tokens(self) -> Optional[int]:
        return self.max_tokens


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

    def requested_max_tokens(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens


# Responses.

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
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


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
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
    logprobs: None = None
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
