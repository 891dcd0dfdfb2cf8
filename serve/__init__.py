"""An OpenAI-compatible server over an evolved engine, with continuous batching.

One job per module, the way nano-vllm's engine/ is split:
  protocol      request and response models (pydantic), OpenAI's shapes
  tokenizer     tokenizer.json + tokenizer_config.json: encode, chat template, stream decode
  sampling      temperature, top-k, top-p and seed for a whole batch, on the device
  sequence      one request's state: its tokens, its limits, its output text
  scheduler     who runs next: admission by K/V capacity, a bounded waiting queue
  model_runner  executes one step through the engine's prefill, decode and remove
  llm_engine    the loop: schedule, run (off the event loop), hand outputs to requests
  serving       what both endpoints share: checks, submission, streaming, usage
  completions   POST /v1/completions;  chat: POST /v1/chat/completions
  app           the ASGI app (FastAPI): routes, errors, disconnects
  bench         the load generator: python -m serve.bench --base-url URL
"""
