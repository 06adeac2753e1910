"""The peak-shaving gateway (`lowtide gateway`): real-time traffic in, the deferrable part
of it out to batch routes. See `app.py` for the flow and docs/gateway.md for the manual."""

from lowtide.server.gateway.app import create_gateway_app
from lowtide.server.gateway.config import GatewayConfig, build_gateway_config, load_gateway_config
from lowtide.server.gateway.policy import RequestInfo, Verdict
from lowtide.server.gateway.webhooks import sign, verify

__all__ = [
    "GatewayConfig",
    "RequestInfo",
    "Verdict",
    "build_gateway_config",
    "create_gateway_app",
    "load_gateway_config",
    "sign",
    "verify",
]
