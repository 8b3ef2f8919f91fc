"""`candle-web serve`: the demo page's server, and with `--api` the OpenAI-compatible API.
(Being split into focused modules; everything callers import is re-exported here.)"""
from .site import *  # noqa: F401, F403
from .site import main  # noqa: F401
