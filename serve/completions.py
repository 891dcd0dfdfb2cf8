"""POST /v1/completions: a prompt (text, texts, token ids, or lists of them) continued."""
from serve.logprobs import completion_logprobs
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
            if min(ids) < 0 or max(ids) >= self.model.vocab_size:  # in C: a Python walk took 0.15 ms a 1,024
                bad = next(t for t in ids if not 0 <= t < self.model.vocab_size)
                raise RequestError(f"prompt: token id {bad} is outside the vocabulary "
                                   f"(0 to {self.model.vocab_size - 1})", param="prompt")
        return prompts

    def choice(self, request, index: int, text: str, token_ids: list, finish_reason,
               logprobs, text_offset: int = 0) -> CompletionChoice:
        if request.logprobs is None:  # best_of may have them without their being asked for
            logprobs = None
        else:
            logprobs = completion_logprobs(self.token_text(request), token_ids, logprobs, text_offset)
        return CompletionChoice(index=index, text=text, finish_reason=finish_reason, logprobs=logprobs,
                                token_ids=token_ids if request.return_token_ids else None)

    async def chunks(self, response_id, request, outputs, seqs):
        text_offsets = [0] * len(seqs)  # each choice's token texts so far, for text_offset
        async for output in outputs:
            if output.text or output.finish_reason or request.return_token_ids or output.logprobs:
                choice = self.choice(request, output.index, output.text, output.token_ids,
                                     output.finish_reason, output.logprobs, text_offsets[output.index])
                if choice.logprobs:
                    text_offsets[output.index] += sum(len(t) for t in choice.logprobs.tokens)
                yield CompletionResponse(id=response_id, model=request.model, choices=[choice])
        if request.include_usage:
            yield CompletionResponse(id=response_id, model=request.model, choices=[],
                                     usage=self.usage(seqs, request.num_samples))

    def response(self, response_id, request, choices, usage) -> CompletionResponse:
        choices = [self.choice(request, i, s.text, s.output_token_ids, s.finish_reason, s.output_logprobs)
                   for i, s in enumerate(choices)]
        return CompletionResponse(id=response_id, model=request.model, choices=choices, usage=usage)
