"""Callback URLs: refused unless they point where the gateway may send results (SSRF).

The rules live in `lowtide.core.callbacks`, shared with job notifications (engine/notify.py);
this module keeps the gateway's names for them.
"""

from lowtide.core.callbacks import CallbackRefused, check_callback, check_url_form, embedded_ipv4

__all__ = ["CallbackRefused", "check_callback", "check_url_form", "embedded_ipv4"]
