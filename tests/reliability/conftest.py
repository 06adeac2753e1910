"""The reliability suite reuses `lowtide serve` as a subprocess from tests/routes."""

from tests.routes.conftest import serve  # noqa: F401  (a fixture, found by name)
