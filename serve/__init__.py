"""An OpenAI-compatible server over an evolved engine, with continuous batching.

One job per module, the way nano-vllm's engine/ is split:
  protocol      request and response models (pydantic), OpenAI's shapes
  tokenizer     tokenizer.json + tokenizer_config.json: encode, chat template, stream decode
  sampling      temperature, top-k, top-p and seed for a whole batch, on the device
  sequence      one sequence in the engine core: its tokens, its limits, where it stands
  scheduler     who runs next: admission by K/V capacity, a bounded waiting queue
  model_runner  executes one step through the engine's prefill, decode and remove
  engine_core   the core's process: schedule, launch, read back, one message out a step
  core_client   the API process's line to it: start, requests out, steps in, stop
  output_processor  a step's tokens as text, stop strings, each request's outbox
  llm_engine    the API side: submit, abort, take the core's steps as they come
  serving       what both endpoints share: checks, submission, streaming, usage
  completions   POST /v1/completions;  chat: POST /v1/chat/completions
  app           the ASGI app (FastAPI): routes, errors, disconnects
  bench         the load generator: python -m serve.bench --base-url URL
"""
