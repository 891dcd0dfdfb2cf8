"""POST /v1/completions: a prompt (text, texts, token ids, or lists of them) continued."""
from serve.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from serve.serving import OpenAIServing, RequestError


class OpenAIServingCompletion(OpenAIServing):
    id_prefix = "cmpl"
    prompt_param = "prompt"

    def prompt_token_ids(self, request: CompletionRequest) -> list:
        """One list of token ids per prompt, each checked against the vocabulary."""
        prompt = request.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        prompts = [self.tokenizer.encode(p) if isinstance(p, str) else p for p in prompt]
        if not prompts or not all(prompts):
            raise RequestError("prompt: every prompt needs at least one token", param="prompt")
        for ids in prompts:
            bad = [t for t in ids if not 0 <= t < self.model.vocab_size]
            if bad:
                raise RequestError(f"prompt: token id {bad[0]} is outside the vocabulary "
                                   f"(0 to {self.model.vocab_size - 1})", param="prompt")
        return prompts

    async def chunks(self, response_id, request, outputs, seqs):
        async for output in outputs:
            if output.text or output.finish_reason or request.return_token_ids:
                choice = CompletionChoice(index=output.index, text=output.text,
                                          finish_reason=output.finish_reason,
                                          token_ids=output.token_ids if request.return_token_ids else None)
                yield CompletionResponse(id=response_id, model=request.model, choices=[choice])
        if request.include_usage:
            yield CompletionResponse(id=response_id, model=request.model, choices=[],
                                     usage=self.usage(seqs))

    def response(self, response_id, request, seqs) -> CompletionResponse:
        choices = [CompletionChoice(index=s.index, text=s.text, finish_reason=s.finish_reason,
                                    token_ids=s.output_token_ids if request.return_token_ids else None)
                   for s in seqs]
        return CompletionResponse(id=response_id, model=request.model, choices=choices,
                                  usage=self.usage(seqs))
