"""A registered route whose module needs a package that is not installed (a provider SDK
that is an extra: mistralai, openrouter) is refused by name, with the install command, not
a crash with ModuleNotFoundError. The route here is a plugin of the test's own, registered
as any plugin is, whose module imports a package no machine has."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from lowtide import routes
from lowtide.core.errors import InputError, RouteError
from lowtide.routes import create_route


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "ghost_route.py").write_text("import lowtide_not_a_real_sdk_xyz\n\ndef create(options):\n    raise AssertionError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = dict(routes._entry_points()) | {"ghost-batch": EntryPoint("ghost-batch", "ghost_route:create", routes.ENTRY_POINT_GROUP)}
    monkeypatch.setattr(routes, "_entry_points", lambda: found)


def test_a_route_whose_package_is_missing_is_refused_with_the_install_command(plugin):
    with pytest.raises(RouteError) as caught:
        create_route("ghost-batch", {})
    assert isinstance(caught.value, InputError)  # exit 2: nothing was submitted
    assert str(caught.value) == (
        'route "ghost-batch" needs the Python package "lowtide_not_a_real_sdk_xyz", which is not installed; '
        "install it: pip install lowtide_not_a_real_sdk_xyz"
    )


def test_each_named_extra_installs_its_package():
    """routes.EXTRAS against pyproject.toml: the extra exists and lists the package's distribution."""
    import re
    import tomllib
    from importlib.metadata import packages_distributions
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dists = packages_distributions()
    for package, extra in routes.EXTRAS.items():
        listed = {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in extras[extra]}
        assert {d.lower().replace("_", "-") for d in dists[package]} & listed, (package, extra, listed)
