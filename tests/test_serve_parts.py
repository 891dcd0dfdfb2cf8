"""The server's parts on their own: toy tokenizer, stream decoding, stop strings, sampling,
the scheduler's admission, the engine core's steps, the app over an engine that breaks (and
its core process's end), and the offline yardstick."""
import asyncio
import gc
import itertools
import json
import multiprocessing
import threading
import random
from types import SimpleNamespace

import pytest
import torch
from fastapi.testclient import TestClient

from serve.__main__ import build, parse_args
from serve.__main__ import main as serve_main
from serve.app import build_app
from serve.core_client import PipeWriter
from serve.engine_core import EngineCore, StepOutputs
from serve.llm_engine import LLMEngine
from serve.replicas import ReplicatedClient, replica_devices
from serve.logprobs import completion_logprobs
from serve.model_runner import LaunchedStep, ModelRunner, warm_up_plan
from serve.output_processor import OutputProcessor, SequenceOutput, SequenceState
from serve.sampling import SEED_LIMIT, SamplingParams, logprobs_of, make_generator, sample
from serve.scheduler import QueueFull, Scheduler, SchedulerConfig
from serve.sequence import Sequence, Status, TokenLogprobs
from serve.serving import RequestError, best_of_each, merged
from serve.tokenizer import FastStreamDecoder, StreamDecoder, Tokenizer
from target import toy_tokenizer
from tests.conftest import REPO, SEED_ENGINE
from serve import bench
from serve.bench import RequestResult, summarize
from tools import served_vs_bound, served_vs_offline, serve_offline, serve_timeline


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return toy_tokenizer.write(512, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return Tokenizer(tokenizer_dir)


def test_the_toy_tokenizer_has_the_targets_vocab_size_and_is_the_same_every_time(tmp_path):
    vocab_size = json.loads((REPO / "target" / "model_config.json").read_text())["vocab_size"]
    first = toy_tokenizer.write(vocab_size, tmp_path / "a")
    second = toy_tokenizer.write(vocab_size, tmp_path / "b")
    assert Tokenizer(first).vocab_size == vocab_size
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes()


def test_the_chat_template_renders_the_messages_and_a_generation_prompt(tokenizer):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi there"}])
    text = tokenizer.backend.decode(ids, skip_special_tokens=False)
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("decoder", [StreamDecoder, FastStreamDecoder])
def test_streamed_text_adds_up_to_the_whole_decode(tokenizer, decoder):
    # Random ids split characters across tokens: what is handed out must still add up.
    rng = random.Random(0)
    for length in (1, 7, 200):
        ids = [rng.randrange(3, 512) for _ in range(length)]
        stream = decoder(tokenizer)
        pieces = [stream.step(ids[:n], is_last=n == len(ids)) for n in range(1, len(ids) + 1)]
        assert "".join(pieces) == tokenizer.decode(ids)


def sequence(tokenizer, **params):
    return SequenceState([1, 2, 3], SamplingParams(**params), tokenizer, asyncio.Queue())


def test_a_stop_string_ends_the_sequence_and_is_never_handed_out(tokenizer):
    ids = tokenizer.encode(" bada kiro sofu bise")
    seq = sequence(tokenizer, max_tokens=50, stop=("kiro",))
    processor = OutputProcessor()
    processor.add([seq])
    stopped = []
    for token_id in ids:  # a step each, as the core sends them
        _, ended = processor.take([step_outputs([seq.seq_id], [token_id])])
        stopped += ended
        processor.hand_out([seq])
    sent = "".join(seq.outbox.get_nowait().text for _ in range(seq.outbox.qsize()))
    assert seq.finish_reason == "stop" and stopped == [seq.seq_id]  # for the core to stop
    assert sent == seq.text == " bada "
    assert seq.output_token_ids == ids[:len(seq.output_token_ids)] and len(seq.output_token_ids) < len(ids)


def step_outputs(seq_ids, token_ids, finished=None):
    return SimpleNamespace(seq_ids=seq_ids, token_ids=token_ids, finished=finished or {}, logprobs={})


def test_steps_that_piled_up_go_to_a_handler_as_one_output(tokenizer):
    seq = sequence(tokenizer, max_tokens=3)
    processor = OutputProcessor()
    processor.add([seq])
    assert processor.num_waiting == 1
    ids = tokenizer.encode(" bada kiro")[:3]
    touched, _ = processor.take([step_outputs([seq.seq_id], [ids[0]]), step_outputs([seq.seq_id], [ids[1]]),
                                 step_outputs([seq.seq_id], [ids[2]], {seq.seq_id: "length"})])
    processor.hand_out(touched)
    (output,) = [seq.outbox.get_nowait() for _ in range(seq.outbox.qsize())]
    assert (output.token_ids, output.text, output.finish_reason) == (ids, tokenizer.decode(ids), "length")
    assert processor.num_waiting == 0 and not processor.seqs


def test_max_tokens_and_eos_end_a_core_sequence(tokenizer):
    eos = tokenizer.eos_token_id
    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True), eos_token_id=eos)
    seq.append(eos)
    assert seq.finish_reason is None
    seq.append(40)
    assert seq.finish_reason == "length"
    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=5), eos_token_id=eos)
    seq.append(eos)
    assert seq.finish_reason == "stop"


def test_outputs_that_piled_up_go_out_as_one_per_sequence():
    pending = [SequenceOutput(0, "ba", [1], None), SequenceOutput(1, "ki", [2], None),
               SequenceOutput(0, "da", [3], "length")]
    assert merged(pending) == [SequenceOutput(0, "bada", [1, 3], "length"),
                               SequenceOutput(1, "ki", [2], None)]
    with pytest.raises(RequestError):
        merged(pending + [RuntimeError("the engine failed")])
    first, second = TokenLogprobs(-1.0, ()), TokenLogprobs(-2.0, ())
    (one,) = merged([SequenceOutput(0, "a", [1], None, [first]), SequenceOutput(0, "b", [2], None, [second])])
    assert one.logprobs == [first, second]


def test_logprobs_are_the_models_own_and_only_for_the_rows_that_ask():
    logits = 3 * torch.randn(3, 100)
    params = [SamplingParams(temperature=0.5, logprobs=2), SamplingParams(),
              SamplingParams(temperature=0.0, logprobs=0)]
    tokens = sample(logits, params, [None] * 3)
    got = logprobs_of(logits, tokens, params)
    expected = logits.log_softmax(dim=-1)[[0, 2]]  # before temperature
    assert got.rows == [0, 2] and got.token_ids[:, 0].tolist() == tokens[[0, 2]].tolist()
    assert got.token_ids[0, 1:].tolist() == expected[0].topk(2).indices.tolist()
    assert torch.allclose(got.values, expected.gather(-1, got.token_ids))
    assert logprobs_of(logits, tokens, [SamplingParams()] * 3) is None
    # On the host, each row cut to the k its sequence asked for.
    seqs = [Sequence([1], p) for p in params]
    by_row = LaunchedStep(seqs, tokens, got).logprobs()
    assert sorted(by_row) == [0, 2] and len(by_row[0].top) == 2 and by_row[2].top == ()
    assert by_row[2].logprob == pytest.approx(expected[1, tokens[2]].item())


def test_a_prompts_seeded_samples_differ_yet_repeat():
    assert [SamplingParams(seed=5).for_sample(i).seed for i in range(3)] == [5, 6, 7]
    assert SamplingParams(seed=SEED_LIMIT - 1).for_sample(1).seed == 0
    assert SamplingParams().for_sample(2).seed is None


def test_best_of_keeps_each_prompts_best_n_by_mean_logprob_the_best_first(tokenizer):
    def sample_with(*logprobs):
        seq = sequence(tokenizer, max_tokens=8, logprobs=0)
        for logprob in logprobs:
            seq.append(40, TokenLogprobs(logprob, ()))
        return seq

    # Two prompts of three samples each; a long sample is not punished for its length.
    seqs = [sample_with(-1.0), sample_with(-0.5, -0.7), sample_with(-3.0),
            sample_with(-2.0), sample_with(-1.0, -1.0, -1.0, -1.0), sample_with(-0.1)]
    assert best_of_each(seqs, 2, 3) == [seqs[1], seqs[0], seqs[5], seqs[4]]
    assert best_of_each(seqs, 3, 3) == seqs


def test_completion_logprobs_list_each_token_its_offset_and_the_top_with_the_sampled_one():
    text = {5: "ab", 6: "c", 7: "xyz"}.get
    logprobs = [TokenLogprobs(-1.0, ((7, -0.5),)), TokenLogprobs(-2.0, ())]
    shown = completion_logprobs(text, [5, 6], logprobs, text_offset=3)
    assert (shown.tokens, shown.text_offset, shown.token_logprobs) == (["ab", "c"], [3, 5], [-1.0, -2.0])
    assert shown.top_logprobs == [{"xyz": -0.5, "ab": -1.0}, {"c": -2.0}]


def test_sampling_is_greedy_at_temperature_zero_and_with_top_k_one():
    logits = torch.randn(4, 100)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, top_k=1),
              SamplingParams(temperature=0.0), SamplingParams(top_p=1e-6)]
    assert sample(logits, params, [None] * 4).tolist() == logits.argmax(-1).tolist()


def test_a_seeded_row_draws_the_same_tokens_whatever_its_neighbours():
    params = SamplingParams(temperature=1.0, seed=7)
    logits = torch.randn(3, 1000)
    alone = [sample(logits[:1], [params], [make_generator(params, "cpu")]).item() for _ in range(2)]
    generators = [make_generator(params, "cpu"), None, None]
    batched = sample(logits, [params, SamplingParams(), SamplingParams()], generators)
    assert alone[0] == alone[1] == batched[0].item()


def test_top_p_keeps_only_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = [SamplingParams(top_p=0.7)]
    drawn = {sample(logits, params, [None]).item() for _ in range(200)}
    assert drawn == {0, 1}


def waiting_seqs(count, prompt_len=10, max_tokens=10):
    return [Sequence([1] * prompt_len, SamplingParams(max_tokens=max_tokens)) for _ in range(count)]


def test_admission_stops_at_the_running_limit_and_at_the_kv_budget():
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=3, max_num_kv_tokens=50, max_num_waiting=10))
    scheduler.add(waiting_seqs(5))  # 20 K/V rows each: two fit in 50
    assert len(scheduler.schedule().prefill) == 2
    assert len(scheduler.schedule().prefill) == 0
    scheduler.finish(scheduler.running[0])
    batch = scheduler.schedule()
    assert len(batch.prefill) == 1 and len(batch.decode) == 1 and len(batch.remove) == 1


def test_a_step_prefills_prompts_up_to_its_token_limit_and_always_one():
    scheduler = Scheduler(SchedulerConfig(max_num_prefill_tokens=25))
    scheduler.add(waiting_seqs(1, prompt_len=40) + waiting_seqs(3))
    assert [len(scheduler.schedule().prefill) for _ in range(3)] == [1, 2, 1]


def test_a_full_waiting_queue_refuses_a_whole_request_and_a_cancelled_one_leaves_it():
    scheduler = Scheduler(SchedulerConfig(max_num_waiting=3))
    first = waiting_seqs(2)
    scheduler.add(first)
    with pytest.raises(QueueFull):
        scheduler.add(waiting_seqs(2))
    assert len(scheduler.waiting) == 2
    scheduler.finish(first[0])
    assert first[0].status is Status.FINISHED and len(scheduler.waiting) == 1
    assert not scheduler.to_remove  # it never reached the engine


class ScriptedEngine:
    """Answers token 7, or EOS once a request has decoded `eos_after` times; checks that
    each decode is fed the token it answered last; counts decodes, records removals."""

    def __init__(self, eos_token_id: int, eos_after: int):
        self.eos_token_id, self.eos_after = eos_token_id, eos_after
        self.decodes, self.answered, self.removed = {}, {}, []

    def answer(self, request_ids, tokens):
        self.answered.update(zip(request_ids, tokens))
        logits = torch.zeros(len(tokens), 512)
        logits[range(len(tokens)), tokens] = 1.0
        return logits

    def prefill(self, request_ids, input_ids):
        return self.answer(request_ids, [7] * len(request_ids))

    def decode(self, request_ids, token_ids):
        assert token_ids.tolist() == [self.answered[i] for i in request_ids]
        for i in request_ids:
            self.decodes[i] = self.decodes.get(i, 0) + 1
        return self.answer(request_ids, [self.eos_token_id if self.decodes[i] >= self.eos_after else 7
                                         for i in request_ids])

    def remove(self, request_ids):
        self.removed += request_ids


def test_a_step_is_launched_before_the_last_is_read_yet_no_token_past_the_end_is_sent(tokenizer):
    """The next step goes to the engine before the tokens of the one in flight are read
    back, so a sequence that meets EOS there is decoded once more; that token is dropped.
    One that reaches max_tokens is never decoded past it."""
    engine = ScriptedEngine(tokenizer.eos_token_id, eos_after=2)
    core = EngineCore(ModelRunner(engine, "cpu"), Scheduler(SchedulerConfig()), tokenizer.eos_token_id)
    long, eos = core.add([(100, [5, 6], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)),
                          (101, [5, 6], SamplingParams(temperature=0.0, max_tokens=10))])
    sent = {100: [], 101: []}
    finished = {}
    while core.has_work():
        outputs = core.step()  # one message a step, every sequence's token in it
        for seq_id, token_id in zip(outputs.seq_ids, outputs.token_ids):
            sent[seq_id].append(token_id)
        finished.update(outputs.finished)
    # ignore_eos: EOS is its third token, not its end; max_tokens is
    assert finished == {100: "length", 101: "stop"}
    assert sent[100] == sent[101] == [7, 7, tokenizer.eos_token_id]
    assert engine.decodes[100] == 2  # tokens 2 and 3; never a 4th
    assert engine.decodes[101] == 3  # the EOS step's follower, launched before EOS was read
    assert eos.output_token_ids == sent[101]
    assert sorted(engine.removed) == [100, 101]
    assert outputs.num_generated_tokens == 6 and outputs.num_running == 0


def test_the_warm_up_steps_through_the_shapes_a_server_meets():
    """On a GPU: prefills of 1, 2, 3 and a full step of long prompts, then a decode at every
    batch size down from max_num_seqs (Triton compiles per specialization: a fresh H200
    server's first step came 0.6-1.6 s late); each step read back, every request removed."""
    plan = warm_up_plan(max_num_seqs=64, max_num_prefill_tokens=16384, max_model_len=2048)
    assert plan[:4] == [(1, 16, [1]), (2, 17, [2]), (3, 1024, [3]), (16, 1024, [16])]
    assert plan[4] == (64, 16, list(range(64, 0, -1)))
    assert warm_up_plan(8, 512, 64)[2:4] == [(3, 32, [3]), (8, 32, [8])]  # a short context's

    class Recording:
        def __init__(self):
            self.calls, self.live = [], set()

        def prefill(self, request_ids, input_ids):
            self.live |= set(request_ids)
            self.calls.append(("prefill", len(request_ids), len(input_ids[0])))
            return torch.zeros(len(request_ids), 512)

        def decode(self, request_ids, token_ids):
            assert set(request_ids) <= self.live and len(token_ids) == len(request_ids)
            self.calls.append(("decode", len(request_ids)))
            return torch.zeros(len(request_ids), 512)

        def remove(self, request_ids):
            self.live -= set(request_ids)

    engine = Recording()
    runner = ModelRunner(engine, "cpu")
    for count, length, sizes in plan:
        runner.warm_up_steps([[0] * length] * count, sizes)
    assert [c for c in engine.calls if c[0] == "prefill"] == [("prefill", n, length) for n, length, _ in plan]
    assert [c[1] for c in engine.calls if c[0] == "decode"] == [n for *_, sizes in plan for n in sizes]
    assert not engine.live


def test_an_aborted_sequence_sends_no_more_tokens_and_leaves_the_engine(tokenizer):
    engine = ScriptedEngine(tokenizer.eos_token_id, eos_after=100)
    core = EngineCore(ModelRunner(engine, "cpu"), Scheduler(SchedulerConfig()), tokenizer.eos_token_id)
    core.add([(200, [5], SamplingParams(temperature=0.0, max_tokens=50))])
    core.step(), core.step()  # launched, then its first token back
    core.handle([("abort", [200]), ("abort", [200])])  # twice: a stop string, then its client leaving
    assert not core.step().seq_ids
    while core.has_work():
        core.step()
    assert engine.removed == [200] and not core.scheduler.running


BROKEN_ENGINE = """
import torch

class BrokenEngine:  # warms up, then fails at its first decode of a prompt served, as a faulty engine file might
    served = set()  # ids of requests whose prompt was not the warm-up's zeros

    def prefill(self, request_ids, input_ids):
        self.served |= {rid for rid, ids in zip(request_ids, input_ids) if ids.any()}
        return torch.zeros(len(request_ids), 512)

    def decode(self, request_ids, token_ids):
        if self.served & set(request_ids):
            raise RuntimeError("the engine broke")
        return torch.zeros(len(request_ids), 512)

    def remove(self, request_ids):
        pass

def create_engine(model_config, weight_dir, device):
    return BrokenEngine()
"""


def served(engine, small_target, tokenizer_dir) -> tuple:
    """(LLMEngine, ServedModel) of `engine` on the small target, its core process started."""
    config, weights = small_target
    return build(parse_args(["--engine", str(engine), "--model-config", str(config), "--weight-dir",
                             str(weights), "--tokenizer", str(tokenizer_dir), "--device", "cpu"]))


def test_the_server_names_a_missing_engine_or_a_weights_file_cut_short_before_it_starts(small_target, tmp_path):
    config, weights = small_target
    args = ["--model-config", str(config), "--device", "cpu", "--port", "0"]
    with pytest.raises(SystemExit, match="serve: error: no engine file"):
        serve_main(["--engine", str(tmp_path / "none.py"), "--weight-dir", str(weights), *args])
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "model.pt").write_bytes((weights / "model.pt").read_bytes()[:1000])
    with pytest.raises(SystemExit, match="serve: error: .*model.pt cannot be read"):
        serve_main(["--engine", str(SEED_ENGINE), "--weight-dir", str(cut), *args])


def test_an_engine_that_fails_fails_its_requests_with_500_and_the_health_check(small_target, tokenizer_dir,
                                                                               tmp_path):
    engine = tmp_path / "broken.py"
    engine.write_text(BROKEN_ENGINE)
    llm, model = served(engine, small_target, tokenizer_dir)
    with TestClient(build_app(llm, model)) as http:
        assert http.get("/health").status_code == 200
        response = http.post("/v1/completions", json={"model": model.name, "prompt": [5], "max_tokens": 4})
        assert response.status_code == 500 and "the engine broke" in response.json()["error"]["message"]
        assert http.get("/health").status_code == 503
        later = http.post("/v1/completions", json={"model": model.name, "prompt": [5]})
        assert later.status_code == 503
    assert llm.client.process.exitcode is not None  # the core's process left with the app


def test_a_core_process_that_dies_fails_the_requests_and_the_health_check(small_target, tokenizer_dir):
    llm, model = served(REPO / "tools" / "probes" / "fixed_step_engine.py", small_target, tokenizer_dir)
    with TestClient(build_app(llm, model)) as http:
        assert http.post("/v1/completions", json={"model": model.name, "prompt": [5], "max_tokens": 2}).status_code == 200
        llm.client.process.kill()
        response = http.post("/v1/completions", json={"model": model.name, "prompt": [5], "max_tokens": 100})
        assert response.status_code in (500, 503) and "exited" in response.json()["error"]["message"]
        assert http.get("/health").status_code == 503


def test_the_offline_yardstick_measures_the_engine_alone(small_target, capsys):
    config, weights = small_target
    serve_offline.main(["--engine", str(SEED_ENGINE), "--model-config", str(config),
                        "--weight-dir", str(weights), "--device", "cpu", "--num-requests", "3",
                        "--input-len", "8", "--output-len", "4", "--repeats", "2"])
    result = json.loads(capsys.readouterr().out)
    assert result["batch_output_tokens_per_s"] > 0
    assert result["prefill_ms"] > 0 and result["decode_step_ms"] > 0


def test_the_load_generator_counts_output_tokens_as_the_server_does(tokenizer):
    """Tokens/s and time per token are the engine's (usage); re-tokenizing the text, which
    merges or splits tokens, is only reported beside them."""
    text = tokenizer.decode([40, 41, 42, 43])
    done = RequestResult(ok=True, text=text, latency=1.0, ttft=0.1, usage_prompt_tokens=8,
                         usage_output_tokens=10)
    level = summarize([done, RequestResult(error="ReadTimeout")], 2.0, 2, tokenizer)
    assert (level["completed"], level["failed"]) == (1, 1)
    assert level["output_tokens"] == 10 and level["output_tokens_per_s"] == 5.0
    assert level["tpot_ms"]["p50"] == pytest.approx(100.0)  # 0.9 s over the 9 tokens after the first
    assert level["retokenized_output_tokens"] == len(tokenizer.encode(text, add_special_tokens=False)) != 10


def test_the_load_generator_times_each_event_by_the_read_that_completed_it(monkeypatch):
    """Events split across reads are joined; each is timed when its last byte came; [DONE]
    ends the stream; the JSON is read only after the level, where an error event fails the
    request."""
    monkeypatch.setattr(bench.time, "perf_counter", itertools.count(1.0).__next__)

    def chunk(text):
        return b'data: {"choices": [{"text": "%s"}]}\n\n' % text.encode()

    class Content:  # an aiohttp response's body, as it came
        def __init__(self, reads):
            self.reads = reads

        async def iter_any(self):
            for data in self.reads:
                yield data

    first, second = chunk("a"), chunk("b")
    reads = [first + second[:7], second[7:] + b"data: [DONE]\n\n", b": a comment after the end\n\n"]
    events = asyncio.run(bench.timed_events(SimpleNamespace(content=Content(reads))))
    assert [t for t, _ in events] == [1.0, 2.0]
    result = bench.read_events(RequestResult(ok=True, sent=0.5, events=events))
    assert (result.ok, result.text, result.ttft, result.chunk_gaps, result.latency) == (True, "ab", 0.5, [1.0], 1.5)
    failing = [(1.0, b'{"error": {"message": "the engine failed"}}')]
    result = bench.read_events(RequestResult(ok=True, sent=0.5, events=failing))
    assert not result.ok and "the engine failed" in result.error


def test_requests_reach_the_core_whole_and_in_order_without_blocking_the_event_loop():
    """A message larger than the pipe holds is written in part at once and the rest as the
    core reads (the loop goes on meanwhile); the next waits behind it; once the core is gone,
    messages are dropped, not raised."""
    core_end, api_end = multiprocessing.Pipe(duplex=False)
    writer = PipeWriter(api_end)
    big = [("add", list(range(300_000)))]  # ~1.5 MB pickled: more than a pipe's buffer
    received = []

    async def burst():
        writer.send(big)
        writer.send([("abort", [1])])
        assert writer.pending  # the loop was not kept waiting for the core
        reading = threading.Thread(target=lambda: received.extend(core_end.recv() for _ in range(2)))
        reading.start()
        while reading.is_alive():
            await asyncio.sleep(0.001)

    asyncio.run(burst())
    assert received == [big, [("abort", [1])]] and not writer.pending
    core_end.close()
    writer.send([("abort", [2])])
    assert writer.is_broken
    writer.close()


def test_the_timeline_rows_each_step_and_each_submission_for_the_ramp(tokenizer, capsys):
    """With --timeline the API side keeps each step's times, its sequences and those still
    waiting, and when each request was submitted; tools.serve_timeline reads a level's
    start from them."""
    sent = []
    core = SimpleNamespace(add=sent.append, abort=sent.append)
    llm = LLMEngine(core, SchedulerConfig(), tokenizer, record_timeline=True)
    _, seqs = llm.submit([[5, 6, 7]], SamplingParams(max_tokens=2))
    assert len(llm.submitted) == 1 and sent[0][0][1] == [5, 6, 7]
    first = llm.submitted[0]
    steps = [StepOutputs([seqs[0].seq_id], [9], {}, {}, 1, waiting, 1, (first + t, first + t + 0.001,
                         first + t + 0.002, first + t + 0.003)) for t, waiting in ((0.010, 3), (0.020, 0))]
    for step in steps:
        llm.take([step])
    rows = serve_timeline.step_rows(llm.timeline)
    assert [(r["seqs"], r["waiting"], r["wall_ms"]) for r in rows] == [(1, 3, 10.0)]
    assert rows[0]["gc_ms"] >= 0
    serve_timeline.print_ramp(rows, llm.submitted, [first + 0.002], 4)
    out = capsys.readouterr().out
    assert "1 requests submitted over 0.0 ms; they reached the core from 2.0 to 2.0 ms" in out
    assert "13.0" in out  # the first step's tokens, 13 ms in
    later = [[t + 1.0 for t in row[:7]] + row[7:] for row in llm.timeline]  # a level a second later
    levels = serve_timeline.split_levels({"steps": llm.timeline + later, "submitted": [first, first + 0.99],
                                          "arrived": [first + 0.995]})
    assert [(len(level["steps"]), level["submitted"], level["arrived"]) for level in levels] == \
        [(2, [first], []), (2, [first + 0.99], [first + 0.995])]
    llm.gc_pauses.stop()
    assert llm.gc_pauses.on_collection not in gc.callbacks  # none left to run in later tests


def test_the_ttft_of_requests_one_by_one_is_taken_apart():
    """Each answer meets its submission, its arrival in the core and the first step after that
    which read a token back; the parts add up to the TTFT."""
    step = lambda t, seqs: [t, t + 0.001, t + 0.004, t + 0.005, t + 0.0055, t + 0.0056, t + 0.006,  # noqa: E731
                            seqs, 0, 0.0, 0.0]
    recorded = {"steps": [step(10.0, 0), step(10.005, 1), step(20.0, 0), step(20.008, 1)],
                "submitted": [10.0, 20.0], "arrived": [10.0004, 20.0002]}
    answers = [serve_timeline.Answer(sent=9.999, first_event=10.0115),
               serve_timeline.Answer(sent=19.998, first_event=20.0145)]
    parts = serve_timeline.ttft_parts(answers, recorded)
    assert parts == {"to_submitted": 1.5, "to_core": 0.3, "core_to_first_sent": 11.2, "sent_to_handed": 1.0,
                     "handed_to_client": 0.5, "ttft": 14.5}
    assert sum(v for k, v in parts.items() if k != "ttft") == pytest.approx(parts["ttft"])


def test_the_server_is_set_against_its_engine_offline():
    """The H100 figures of docs/log/2026-11-25-public-show-twelve-layer-serve-sweep.md, by the server's usage."""
    offline = {"batch_output_tokens_per_s": 16971.952, "prefill_ms": 5.018, "decode_step_ms": 1.56}
    level = lambda c, tps, ttft, tpot: {"concurrency": c, "output_tokens_per_s": tps,  # noqa: E731
                                        "ttft_ms": {"p50": ttft}, "tpot_ms": {"p50": tpot}}
    bench = {"sweep": [level(1, 466.4, 10.108, 2.135), level(64, 8867.2, 395.4, 6.769)],
             "burst": {"requests": 300, "completed": 300, "output_tokens_per_s": 13000.0}}
    assert served_vs_offline.compare(offline, bench) == {
        "concurrency": 64, "served_over_offline_tokens_per_s": 0.522, "ttft_minus_prefill_ms": 5.09,
        "tpot_over_decode_step": 1.369, "burst_over_offline_tokens_per_s": 0.766, "burst_lost": 0}


def test_the_hackathon_score_is_the_weighted_sum_of_each_levels_prompt_and_completion_tokens():
    # Seed 001's baseline table (vLLM 0.19, 8 H200s): its score, 191,151.
    table = {1: 984, 2: 1753, 4: 3038, 8: 4749, 16: 6446, 32: 11144, 64: 12810}
    levels = [{"concurrency": c, "total_tokens_per_s": tps} for c, tps in table.items()]
    assert bench.harness_score(levels) == bench.VLLM_BASELINE_SCORE == 191_151
    # Some of the levels, or one of them twice, is not the sweep the score weighs.
    assert bench.harness_score(levels[4:]) is None and bench.weighted_score(levels[4:]) is None
    assert bench.harness_score(levels + levels[-1:]) is None


def test_the_hackathon_workload_sets_its_defaults_and_the_command_line_still_stands():
    args = bench.parse_args(["--base-url", "http://x", "--workload", "hackathon", "--num-requests", "8"])
    assert (args.input_len, args.output_len, args.warmup, args.burst) == (1024, 323, 2, 0)
    assert args.concurrency == [1, 2, 4, 8, 16, 32, 64] and args.num_requests == 8
    assert bench.parse_args(["--base-url", "http://x"]).output_len == 1024


def test_each_replica_sees_one_of_the_gpus_the_server_was_given(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert replica_devices(2, on_cuda=True) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # not GPUs 0 and 1 again
    assert replica_devices(2, on_cuda=True) == ["2", "3"] and replica_devices(1, on_cuda=True) == ["2"]
    assert replica_devices(2, on_cuda=False) == [None, None]  # a CPU's replicas share the host


def test_replicas_take_each_sequence_to_the_least_loaded_and_free_it_when_it_ends():
    class Core:  # an EngineCoreClient's add and abort, recorded
        def __init__(self):
            self.added, self.aborted = [], []

        def add(self, requests):
            self.added += [r[0] for r in requests]

        def abort(self, seq_ids):
            self.aborted += seq_ids

    client = ReplicatedClient.__new__(ReplicatedClient)
    client.replicas, client.owner, client.in_flight = [Core(), Core()], {}, [0, 0]
    client.add([(i, [1], None) for i in range(5)])
    assert [c.added for c in client.replicas] == [[0, 2, 4], [1, 3]]
    client.abort([0, 2, 99])  # 99: unknown, ignored
    assert client.replicas[0].aborted == [0, 2] and client.in_flight == [1, 2]
    client.add([(5, [1], None), (6, [1], None)])
    assert client.replicas[0].added[-2:] == [5, 6] and client.in_flight == [3, 2]


def test_a_reports_levels_beside_the_most_their_workload_allows(tmp_path, capsys):
    # One H200's hybrid at the hackathon's levels 1 and 64
    # (docs/log/2026-11-29-moe-search-from-seed-hybrid-one-gpu-sweep.md).
    from target.hf_checkpoints import QWEN3_5_35B_A3B
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN3_5_35B_A3B))
    report = {"settings": {"input_len": 1024, "output_len": 323},
              "sweep": [{"concurrency": 1, "requests": 64, "output_tokens_per_s": 220.52},
                        {"concurrency": 64, "requests": 64, "output_tokens_per_s": 2010.06}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    if not torch.cuda.is_available():  # --gpu auto, and no GPU here: the report stays as it is
        served_vs_bound.main([str(path), "--model-config", str(config), "--gpu", "auto"])
        assert json.loads(path.read_text()) == report and "no roofline" in capsys.readouterr().out
    served_vs_bound.main([str(path), "--model-config", str(config), "--gpu", "h200"])
    levels = json.loads(path.read_text())["sweep"]
    assert [level["bound_output_tokens_per_s"] for level in levels] == pytest.approx([689.5, 3674], abs=1)
    assert [level["of_bound"] for level in levels] == [0.3198, 0.5471]
    assert "concurrency   64:    2,010.1 output tok/s, 0.547 of 3,674 (h200)" in capsys.readouterr().out
