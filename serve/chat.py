"""POST /v1/chat/completions: messages through the model's chat template, then continued."""
from jinja2.exceptions import TemplateError

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

    @staticmethod
    def chunk(response_id, request, delta: Delta, finish_reason=None, token_ids=None):
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish_reason,
                                 token_ids=token_ids if request.return_token_ids else None)
        return ChatCompletionChunk(id=response_id, model=request.model, choices=[choice])

    async def chunks(self, response_id, request, outputs, seqs):
        # As OpenAI does: the role first, then the content, then why it stopped.
        yield self.chunk(response_id, request, Delta(role="assistant", content=""))
        async for output in outputs:
            if output.text or output.finish_reason or request.return_token_ids:
                yield self.chunk(response_id, request, Delta(content=output.text),
                                 output.finish_reason, output.token_ids)
        if request.include_usage:
            yield ChatCompletionChunk(id=response_id, model=request.model, choices=[],
                                      usage=self.usage(seqs))

    def response(self, response_id, request, seqs) -> ChatCompletionResponse:
        (seq,) = seqs
        choice = ChatChoice(index=0, message=AssistantMessage(content=seq.text),
                            finish_reason=seq.finish_reason,
                            token_ids=seq.output_token_ids if request.return_token_ids else None)
        return ChatCompletionResponse(id=response_id, model=request.model, choices=[choice],
                                      usage=self.usage(seqs))
