"""echo-batch answers a line echo cannot answer with that line's failure, as a provider
answers a bad line, never by failing the whole batch: a body that passed no refusal (one
stored by an older lowtide, whose refusals did not check a limit's type) raised out of the
results, and the engine took every poll's ingest for a download that broke off, for ever."""

from __future__ import annotations

import asyncio

from lowtide.core.endpoints import CHAT
from lowtide.core.types import Request
from lowtide.routes.own.echo_batch import EchoBatchRoute


def test_one_line_echo_cannot_answer_fails_alone(tmp_path):
    route = EchoBatchRoute({"dir": str(tmp_path)})
    turns = [{"role": "user", "content": "hello"}]
    requests = [Request("good-1", CHAT, {"model": "m", "messages": turns}), Request("bad", CHAT, {"model": "m", "messages": turns, "max_tokens": "50"}),
                Request("good-2", CHAT, {"model": "m", "messages": turns, "max_tokens": 1})]  # fmt: skip

    async def run():
        batch = await route.submit("k", requests)
        assert (await route.poll(batch)).ended
        return {o.custom_id: o async for o in route.results(batch)}

    got = asyncio.run(run())
    assert (got["good-1"].ok, got["good-1"].text, got["good-2"].text) == (True, "hello", "hell")  # cut at 1 token: 4 characters
    bad = got["bad"]
    assert (bad.ok, bad.error_code, bad.retryable) == (False, "invalid_request", False)
    assert bad.error_message.startswith("max_tokens: must be a whole number of tokens")
