"""What the completions and chat handlers share: checks, submission, streaming, usage."""
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional

from pydantic import BaseModel
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from serve.llm_engine import LLMEngine
from serve.logprobs import as_token_id
from serve.protocol import ErrorBody, ErrorResponse, Usage, new_id
from serve.scheduler import QueueFull
from serve.output_processor import SequenceOutput


class RequestError(Exception):
    """A request the server will not run; the app answers it with an OpenAI error body."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.body = ErrorResponse(error=ErrorBody(message=message, type=type, param=param, code=status))
        self.status = status


@dataclass(frozen=True)
class ServedModel:
    name: str
    vocab_size: int
    max_model_len: int  # prompt + output tokens of one request


def merged(outputs: list) -> list:
    """One SequenceOutput per sequence of `outputs` (in order), each the sum of its own."""
    by_index = {}
    for output in outputs:
        if isinstance(output, Exception):
            raise RequestError(f"the engine failed: {output}", status=500, type="server_error")
        if output.index in by_index:
            first = by_index[output.index]
            logprobs = first.logprobs + output.logprobs if output.logprobs is not None else None
            output = SequenceOutput(output.index, first.text + output.text,
                                    first.token_ids + output.token_ids, output.finish_reason, logprobs)
        by_index[output.index] = output
    return list(by_index.values())


def best_of_each(seqs: list, n: int, num_samples: int) -> list:
    """Of each prompt's num_samples finished samples (side by side in `seqs`), the n of the
    highest mean log-probability, the best first; all, in order, when n is all there are."""
    if n == num_samples:
        return seqs
    best = []
    for start in range(0, len(seqs), num_samples):
        samples = seqs[start:start + num_samples]
        best += sorted(samples, key=lambda s: s.mean_logprob, reverse=True)[:n]
    return best


def sse(payload: str) -> str:
    """One server-sent event, as the OpenAI API sends them."""
    return f"data: {payload}\n\n"


class OpenAIServing:
    """A request's way through the server; a subclass says how its endpoint reads prompts
    and writes answers."""
    id_prefix = ""  # of the response's id
    prompt_param = ""  # the request field that carries the prompt

    def __init__(self, llm: LLMEngine, model: ServedModel):
        self.llm = llm
        self.model = model
        self.tokenizer = llm.tokenizer

    async def create(self, request):
        self.check_model(request.model)
        prompts = self.prompt_token_ids(request)
        self.check_num_seqs(len(prompts), request)
        max_tokens = min(self.check_lengths(p, request.requested_max_tokens(), self.prompt_param)
                         for p in prompts)
        outbox, seqs = self.submit(prompts, request.sampling_params(max_tokens), request.num_samples)
        outputs = self.outputs(outbox, seqs)
        response_id = new_id(self.id_prefix)
        if request.stream:
            return self.stream(self.chunks(response_id, request, outputs, seqs), seqs)
        async for _ in outputs:
            pass  # each sequence keeps its own text and tokens
        choices = best_of_each(seqs, request.n, request.num_samples)
        response = self.response(response_id, request, choices, self.usage(seqs, request.num_samples))
        return JSONResponse(response.model_dump(exclude_none=True))

    def prompt_token_ids(self, request) -> list:
        """One list of token ids per prompt."""
        raise NotImplementedError

    def chunks(self, response_id: str, request, outputs: AsyncIterator, seqs) -> AsyncIterator:
        """The streamed answer's chunks (pydantic models)."""
        raise NotImplementedError

    def response(self, response_id: str, request, choices: list, usage: Usage) -> BaseModel:
        """The whole answer, once every sequence has finished: `choices` are the sequences
        answered, in order."""
        raise NotImplementedError

    def token_text(self, request) -> Callable:
        """How the request's log-probabilities show a token."""
        return as_token_id if request.return_tokens_as_token_ids else self.tokenizer.token_text

    def check_model(self, name: str) -> None:
        if name != self.model.name:
            raise RequestError(f"model: {name!r} is not served here; this server serves "
                               f"{self.model.name!r}", param="model")

    def check_num_seqs(self, num_prompts: int, request) -> None:
        """A request whose sequences could never wait in the queue together is refused (400),
        rather than told to retry (503) for ever."""
        limit = self.llm.scheduler_config.max_num_waiting
        if num_prompts * request.num_samples > limit:
            param = self.prompt_param if request.num_samples == 1 else "best_of" if request.best_of else "n"
            raise RequestError(f"{param}: {num_prompts} prompts of {request.num_samples} samples each "
                               f"are more sequences than this server queues ({limit})", param=param)

    def check_lengths(self, prompt: list, max_tokens: Optional[int], prompt_param: str) -> int:
        """The request's max_tokens (the rest of the context when not given), once checked."""
        context = self.model.max_model_len
        if len(prompt) >= context:
            raise RequestError(f"{prompt_param}: the prompt has {len(prompt)} tokens; the model's context is "
                               f"{context}, output included", param=prompt_param)
        if max_tokens is None:
            max_tokens = context - len(prompt)
        if len(prompt) + max_tokens > context:
            raise RequestError(f"max_tokens: {max_tokens} tokens after a prompt of {len(prompt)} "
                               f"pass the model's context of {context} tokens", param="max_tokens")
        if not self.llm.scheduler_config.fits_ever(len(prompt) + max_tokens):
            raise RequestError(f"max_tokens: {max_tokens} tokens after a prompt of {len(prompt)} "
                               "are more than this server's K/V memory holds", param="max_tokens")
        return max_tokens

    def submit(self, prompts: list, params, num_samples: int) -> tuple:
        try:
            return self.llm.submit(prompts, params, num_samples)
        except QueueFull as error:
            raise RequestError(f"the server is overloaded: {error}; retry later", status=503,
                               type="server_overloaded") from None
        except RuntimeError as error:
            raise RequestError(str(error), status=503, type="server_error") from None

    async def outputs(self, outbox, seqs) -> AsyncIterator:
        """The SequenceOutputs of `seqs` until all have finished. A consumer that stops
        early (its client left) cancels the sequences that were still running.

        What piled up while the consumer was busy comes as one output per sequence, so a
        server behind on its streams sends fewer, larger chunks instead of falling further
        behind (as vLLM's output collector does).
        """
        try:
            num_running = len(seqs)
            while num_running:
                pending = [await outbox.get()]
                while not outbox.empty():
                    pending.append(outbox.get_nowait())
                for output in merged(pending):
                    num_running -= output.finish_reason is not None
                    yield output
        finally:
            self.llm.abort(seqs)

    @staticmethod
    def usage(seqs, num_samples: int) -> Usage:
        """Each prompt counted once; every sample's tokens (best_of's unanswered ones too, as
        OpenAI bills them)."""
        prompt = sum(len(s.prompt_token_ids) for s in seqs[::num_samples])
        completion = sum(len(s.output_token_ids) for s in seqs)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def stream(self, chunks: AsyncIterator, seqs) -> StreamingResponse:
        """Server-sent events of `chunks`, then [DONE]. However the stream ends (a client
        that leaves before the first chunk included), the sequences are cancelled."""
        return StreamingResponse(self.events(chunks), media_type="text/event-stream",
                                 background=BackgroundTask(self.cancel, seqs))

    async def cancel(self, seqs) -> None:
        # A coroutine, so Starlette runs it on the event loop, which owns the scheduler
        # (a plain function would run in a worker thread).
        self.llm.abort(seqs)

    @staticmethod
    async def events(chunks: AsyncIterator) -> AsyncIterator:
        try:
            async for chunk in chunks:
                yield sse(chunk.model_dump_json(exclude_none=True))
        except RequestError as error:
            yield sse(error.body.model_dump_json())
        yield sse("[DONE]")
