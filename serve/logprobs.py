"""Sampled tokens' log-probabilities in the OpenAI API's two shapes: the legacy
completions' parallel lists and chat's one entry per token.

A token is shown by `token_text`: its own text (Tokenizer.token_text), or, with vLLM's
return_tokens_as_token_ids, "token_id:ID", which tells apart tokens of one text (byte
tokens that are each part of a character all show U+FFFD).
"""
from itertools import accumulate
from typing import Callable

from serve.protocol import CompletionLogprobs, ChatLogprobs, TokenLogprob, TopLogprob


def as_token_id(token_id: int) -> str:
    return f"token_id:{token_id}"


def completion_logprobs(token_text: Callable, token_ids: list, logprobs: list,
                        text_offset: int = 0) -> CompletionLogprobs:
    """`logprobs` (TokenLogprobs of token_ids) as /v1/completions answers them; each
    token's text_offset counts the token texts before it, from `text_offset`."""
    tokens = [token_text(t) for t in token_ids]
    offsets = list(accumulate((len(t) for t in tokens), initial=text_offset))[:-1]
    # Up to k + 1 entries: the top k and the sampled token, as OpenAI's legacy API has it.
    top = [{**{token_text(i): v for i, v in lp.top}, token: lp.logprob}
           for token, lp in zip(tokens, logprobs)]
    return CompletionLogprobs(text_offset=offsets, token_logprobs=[lp.logprob for lp in logprobs],
                              tokens=tokens, top_logprobs=top)


def top_logprob(token_text: Callable, token_id: int, logprob: float) -> TopLogprob:
    token = token_text(token_id)
    return TopLogprob(token=token, logprob=logprob, bytes=list(token.encode()))


def chat_logprobs(token_text: Callable, token_ids: list, logprobs: list) -> ChatLogprobs:
    """`logprobs` (TokenLogprobs of token_ids) as /v1/chat/completions answers them."""
    content = []
    for token_id, lp in zip(token_ids, logprobs):
        chosen = top_logprob(token_text, token_id, lp.logprob)
        top = [top_logprob(token_text, i, v) for i, v in lp.top]
        content.append(TokenLogprob(**chosen.model_dump(), top_logprobs=top))
    return ChatLogprobs(content=content)
