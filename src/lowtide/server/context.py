"""What the server is configured with, and what its parts share while it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowtide.server.translate import Rejection, prepare, rejection
from lowtide.store.db import Store

if TYPE_CHECKING:
    from lowtide.server.clock import ScaledClock, SteppedClock
    from lowtide.server.faults import Faults

MB = 1024 * 1024
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything `lowtide serve` takes. The limits are the providers' own; tests lower them."""

    backend: str = "echo"
    route_options: dict[str, Any] = field(default_factory=dict)
    # Run every batch on this model of the backend; default: the model each batch names.
    model: str | None = None
    # What lowtide does for a line the backend keeps failing, as a job spec says it
    # (docs/fallback.md): attempts per line on the backend, and where a line then goes
    # ({"route", "route_options", "model"}; None: it fails, as it did on the backend).
    max_attempts: int = 3
    fallback: dict[str, Any] | None = None
    data_dir: Path = Path("lowtide-serve")
    db: str | None = None
    time_scale: float = 1.0
    complete_after: float = 0.0  # scaled seconds after creation before a batch may finish
    faults: Path | None = None
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # never printed, never stored
    # Other sites (server/guard.py): names served besides localhost and IP addresses while no
    # key is configured ("*": any), and origins whose pages may call it besides its own.
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()
    max_file_bytes: int = 512 * MB  # one upload to /v1/files
    # Every other JSON body (real time, /v1/batches); a message batch's body is capped by
    # anthropic_max_bytes. Each limit holds while reading (server/bodies.py).
    max_request_bytes: int = 32 * MB
    body_timeout: float = 30.0  # real seconds a client may pause while sending a body
    max_json_depth: int = 64  # nesting of any JSON body or batch line
    openai_max_bytes: int = 200 * MB
    openai_max_requests: int = 50_000
    anthropic_max_bytes: int = 256 * MB
    anthropic_max_requests: int = 100_000
    completion_window: float = DAY  # both APIs: a batch expires 24 h after creation
    # Ready-made route instances by route name, handed to the engine (an embedding
    # program's own, or a probe in a test); other routes are built from the name.
    routes: dict[str, Any] = field(default_factory=dict, repr=False)
    # A clock to run on instead of real time (a `lowtide.core.clock.Clock`, e.g. the
    # ManualClock a simulation shares with its client engine); `time_scale` is then unused
    # and nothing of the clock is kept in the store.
    clock: Any = field(default=None, repr=False)
    # False: no worker thread; the embedding program moves batches on itself, one pass per
    # `await app.state.worker.run_once()` (a simulation steps serve between client ticks).
    run_worker: bool = True
    # True: the fault plan may be swapped while serving (`Faults.swap`), so the HTTP fault
    # layer is installed even when the first plan has no `http` rules.
    swappable_faults: bool = False


@dataclass(slots=True)
class Server:
    """The running server's shared parts; handlers reach it as `request.app.state.server`."""

    config: ServeConfig
    store: Store
    clock: ScaledClock | SteppedClock
    faults: Faults
    data_dir: Path
    wake: Any = None  # callable: tell the worker there is news (a batch, a cancel)
    # The backend route, asked what it refuses before a request is stored (translate.py).
    route: Any = None
    # Live counts of running batches, by id: (when read, monotonic; the summary). Counting
    # a 50,000-request batch takes a scan; clients polling several times a second share one.
    live_counts: dict[str, tuple[float, Any]] = field(default_factory=dict)

    def path(self, relative: str) -> Path:
        return self.data_dir / relative

    def refuse(self, endpoint: str, api: str = "openai") -> Callable[[dict[str, Any]], Rejection | None]:
        """What a body for `endpoint` fails with on the backend, or None (it may run)."""
        prepare(endpoint)
        return lambda body: rejection(self.route, endpoint, body, self.config.model, api)

    def notify(self) -> None:
        if self.wake is not None:
            self.wake()
