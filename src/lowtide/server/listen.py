"""How `lowtide serve` and `lowtide gateway` listen: uvicorn, plus a deadline for each
request's head (its request line and headers).

uvicorn times out a connection idle between requests (`timeout_keep_alive`), but not one
that sends a head slowly, a byte now and then, or connects and sends nothing (slowloris):
each holds a socket for ever, and enough of them hold every socket the process may open
(uvicorn issue #157, "--timeout-request-start", still open). Here a connection must finish
each head within `header_timeout` seconds of its first byte (the first one: of connecting),
or it is closed. A body is bounded apart (`--body-timeout`, server/bodies.py).

    uvicorn.Server(listen.config(app, header_timeout=10, log_level="warning")).run(sockets=[sock])
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn

HEADER_TIMEOUT = 10.0  # seconds; a browser or SDK sends a head in one packet
log = logging.getLogger("lowtide.listen")


def config(app: Any, *, header_timeout: float = HEADER_TIMEOUT, **options: Any) -> uvicorn.Config:
    """uvicorn's config for `app`, its HTTP protocol given a head deadline."""
    import uvicorn  # here: the CLI imports this module, and uvicorn only when it serves

    return uvicorn.Config(app, http=with_head_deadline(header_timeout), **options)


def with_head_deadline(timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, closing a connection whose head takes over `timeout` s."""
    # uvicorn[standard]'s protocol, the one its "auto" picks.
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeadDeadline(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()  # a client that connects and sends nothing

        def on_message_begin(self) -> None:  # the first byte of a request line
            super().on_message_begin()
            if self._timer is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._timer = self.loop.call_later(timeout, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                # DEBUG: a flood of these is the attack itself; one line each would be a second one.
                log.debug("closed a connection from %s: no complete request head within %g s", self.client, timeout)
                self.transport.close()

    return HeadDeadline
