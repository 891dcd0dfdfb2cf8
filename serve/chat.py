"""POST /v1/chat/completions: messages through the model's chat template, then continued."""
from jinja2.exceptions import TemplateError

from serve.logprobs import chat_logprobs
from serve.protocol import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                            ChatCompletionRequest, ChatCompletionResponse, Delta)
from serve.serving import OpenAIServing, RequestError


class OpenAIServingChat(OpenAIServing):
    id_prefix = "chatcmpl"
    prompt_param = "messages"

    def prompt_token_ids(self, request: ChatCompletionRequest) -> list:
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        try:
            return [self.tokenizer.apply_chat_template(messages)]
        except (TemplateError, ValueError) as error:
            raise RequestError(f"messages: the chat template failed: {error}", param="messages") from None

    def logprobs(self, request, token_ids: list, logprobs):
        return chat_logprobs(self.token_text(request), token_ids, logprobs) if request.logprobs else None

    def chunk(self, response_id, request, index: int, delta: Delta, finish_reason=None,
              token_ids=None, logprobs=None):
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason,
                                 logprobs=self.logprobs(request, token_ids, logprobs) if logprobs else None,
                                 token_ids=token_ids if request.return_token_ids else None)
        return ChatCompletionChunk(id=response_id, model=request.model, choices=[choice])

    async def chunks(self, response_id, request, outputs, seqs):
        # As OpenAI does: each choice's role first, then the content, then why it stopped.
        for seq in seqs:
            yield self.chunk(response_id, request, seq.index, Delta(role="assistant", content=""))
        async for output in outputs:
            if output.text or output.finish_reason or request.return_token_ids or output.logprobs:
                yield self.chunk(response_id, request, output.index, Delta(content=output.text),
                                 output.finish_reason, output.token_ids, output.logprobs)
        if request.include_usage:
            yield ChatCompletionChunk(id=response_id, model=request.model, choices=[],
                                      usage=self.usage(seqs, request.num_samples))

    def response(self, response_id, request, choices, usage) -> ChatCompletionResponse:
        choices = [ChatChoice(index=i, message=AssistantMessage(content=s.text),
                              finish_reason=s.finish_reason,
                              logprobs=self.logprobs(request, s.output_token_ids, s.output_logprobs),
                              token_ids=s.output_token_ids if request.return_token_ids else None)
                   for i, s in enumerate(choices)]
        return ChatCompletionResponse(id=response_id, model=request.model, choices=choices, usage=usage)
