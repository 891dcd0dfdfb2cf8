"""The ASGI app (FastAPI): routes, OpenAI-style errors, and cancelling what a client left."""
import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from serve.chat import OpenAIServingChat
from serve.completions import OpenAIServingCompletion
from serve.llm_engine import LLMEngine
from serve.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from serve.serving import RequestError, ServedModel

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before its answer


def build_app(llm: LLMEngine, model: ServedModel) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        loop_task = asyncio.create_task(llm.run_forever())
        yield
        loop_task.cancel()
        llm.shutdown()  # the engine core's process leaves with the server

    app = FastAPI(title="engine-evolver", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(RequestError, request_error)
    completions = OpenAIServingCompletion(llm, model)
    chat = OpenAIServingChat(llm, model)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if llm.is_running else 503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus_text(llm))

    @app.get("/timeline")
    async def timeline():
        """The steps and submissions recorded since the last call (--timeline), then forgotten."""
        if llm.timeline is None:
            return Response(status_code=404)
        recorded = {"steps": llm.timeline, "submitted": llm.submitted, "arrived": llm.arrived}
        llm.timeline, llm.submitted, llm.arrived = [], [], []
        return recorded

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=model.name, max_model_len=model.max_model_len)])

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request):
        return await unless_disconnected(request, completions.create(body))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        return await unless_disconnected(request, chat.create(body))

    return app


def prometheus_text(llm: LLMEngine) -> str:
    """The serving loop's state in Prometheus' text format."""
    return "".join(f"serve_{name} {value}\n" for name, value in llm.metrics().items())


async def unless_disconnected(request: Request, answer):
    """Await `answer`, cancelling it (and so its sequences) if the client disconnects first.

    A streamed answer returns at once; the stream itself watches for the disconnect.
    """
    answering = asyncio.ensure_future(answer)
    disconnected = asyncio.ensure_future(wait_for_disconnect(request))
    done, pending = await asyncio.wait({answering, disconnected}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if answering in done:
        return answering.result()
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """400 naming the first bad field (or saying the body is not JSON)."""
    first = error.errors()[0]
    if first["type"] == "json_invalid":
        return error_response(RequestError(f"the body is not valid JSON: {first['msg']}"))
    path = [str(part) for part in first["loc"] if part != "body"]
    where = ".".join(path) or "body"
    return error_response(RequestError(f"{where}: {first['msg']}", param=path[0] if path else None))


def request_error(request: Request, error: RequestError) -> JSONResponse:
    return error_response(error)


def error_response(error: RequestError) -> JSONResponse:
    return JSONResponse(error.body.model_dump(), status_code=error.status)
