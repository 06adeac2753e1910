"""Who `vertex-batch` calls Vertex AI as, and where: credentials, project and location,
settled when the route is made, so a job that cannot run is refused before anything is stored.

Credentials, the first that applies:

1. `route_options.access_token_env`: the environment variable holding an OAuth access token
   (as `gcloud auth print-access-token` prints one; it is not refreshed);
2. `route_options.anonymous: true`, only with a loopback `base_url` (`lowtide serve`): a
   placeholder token;
3. Application Default Credentials (`gcloud auth application-default login`,
   GOOGLE_APPLICATION_CREDENTIALS, or the machine's service account).

Project: `route_options.project`, else GOOGLE_CLOUD_PROJECT, else the credentials' own.
Location: `route_options.location`, else GOOGLE_CLOUD_LOCATION, else us-central1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from lowtide.core.errors import RouteError
from lowtide.routes.options import flag_option, text_option
from lowtide.routes.provider import is_loopback, not_a_variable, pasted_key

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
DEFAULT_LOCATION = "us-central1"
ANONYMOUS_TOKEN = "anonymous"  # what a loopback server is sent in place of a token
ADC_FIX = ("run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a service account's "
           "key file), or name an environment variable holding an access token in route_options.access_token_env")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Access:
    credentials: Any  # google.auth.credentials.Credentials
    project: str
    location: str
    token: str | None  # a token the route was given (to be kept out of errors); None for ADC's own


def access(route: str, options: dict[str, Any]) -> Access:
    """The credentials, project and location, or a RouteError naming the fix."""
    from google.oauth2.credentials import Credentials

    base_url = text_option(route, options, "base_url")
    found_project = None
    token = None
    env = options.get("access_token_env")
    if env is not None:
        if not_a_variable(env):
            raise RouteError(pasted_key(route).replace("api_key_env", "access_token_env"))
        token = os.environ.get(env)
        if not token:
            raise RouteError(f"{route}: no access token: the environment variable {env} (route_options.access_token_env) "
                             f"is not set; set it (gcloud auth print-access-token), or leave access_token_env out to use "
                             f"Application Default Credentials")  # fmt: skip
        credentials = Credentials(token=token)
    elif flag_option(route, options, "anonymous", False):
        if not is_loopback(base_url):
            raise RouteError(f"{route}: route_options.anonymous is only for a server on this machine (a loopback "
                             f"base_url, such as `lowtide serve`), not {base_url or 'Vertex AI'}; remove it and {ADC_FIX}")  # fmt: skip
        credentials = Credentials(token=ANONYMOUS_TOKEN)
    else:
        credentials, found_project = _default_credentials(route)
    project = text_option(route, options, "project") or os.environ.get("GOOGLE_CLOUD_PROJECT") or found_project
    if not project:
        raise RouteError(f"{route}: no Google Cloud project: give route_options.project, or set GOOGLE_CLOUD_PROJECT "
                         f"(gcloud config get-value project names yours)")  # fmt: skip
    location = text_option(route, options, "location") or os.environ.get("GOOGLE_CLOUD_LOCATION") or DEFAULT_LOCATION
    return Access(credentials, project, location, token)


def _default_credentials(route: str) -> tuple[Any, str | None]:
    import google.auth
    from google.auth import exceptions

    try:
        return google.auth.default(scopes=SCOPES)
    except exceptions.DefaultCredentialsError as err:
        raise RouteError(f"{route}: no Google Cloud credentials ({str(err).splitlines()[0][:200]}); {ADC_FIX}") from None
