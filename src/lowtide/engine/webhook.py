"""One webhook attempt, bounded: the transport the gateway's webhooks (server/gateway/
webhooks.py) and job notifications (engine/notify.py) share.

An attempt has one deadline over the URL's check (core/callbacks.py, again before each
attempt: a name may resolve elsewhere by now), connecting, sending and the answer's status
line and headers. At most ANSWER_BYTES of the answer's body are read (so a short answer
leaves the connection reusable), none of it matters, and the rest is never read: a receiver
that drips or floods costs only its own attempt. Redirects are not followed. Any 2xx is a
delivery.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from lowtide.core.callbacks import CallbackRefused, Callbacks, check_callback

if TYPE_CHECKING:
    import httpx

ANSWER_BYTES = 4096  # of a receiver's answer body, read at most (only its status counts)


def webhook_client(connections: int, timeout: float) -> httpx.AsyncClient:
    """A client for attempts: `connections` at once, no redirects followed."""
    import httpx  # here, not above: every engine imports this module, few send a webhook (httpx brings its CLI's rich and click)

    return httpx.AsyncClient(timeout=timeout, follow_redirects=False,
                             limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))  # fmt: skip


async def post_once(client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], timeout: float,
                    rules: Callbacks) -> str | None:  # fmt: skip
    """One attempt: None for a 2xx within `timeout`, else why not. Raises CallbackRefused
    for a URL that may not be used."""
    import httpx

    deadline = asyncio.get_running_loop().time() + timeout
    try:
        request = client.build_request("POST", url, content=body, headers=headers)
    except httpx.InvalidURL as err:  # (not an HTTPError): a URL no attempt can reach, now or later
        raise CallbackRefused(f"callback URL: {err}") from None
    try:
        async with asyncio.timeout_at(deadline):
            await check_callback(url, rules)
            answer = await client.send(request, stream=True)
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except httpx.HTTPError as err:
        return type(err).__name__
    try:  # a little of the body, so a short answer leaves the connection reusable; no more
        async with asyncio.timeout_at(deadline):
            read = 0
            async for chunk in answer.aiter_raw():
                read += len(chunk)
                if read >= ANSWER_BYTES:
                    break
    except (TimeoutError, httpx.HTTPError):
        pass  # the status is in; the body never counted
    finally:
        await answer.aclose()
    return None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"
