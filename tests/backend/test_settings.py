"""The kernel switches (pkg/candle_web/backend/settings.py): `override_settings` sets a switch
for the process over the environment, checks what it is given, leaves the environment alone,
and `reload_settings` starts over from the environment."""

from __future__ import annotations

import os

import pytest

from candle_web.backend import _default_cpu_backend_name
from candle_web.backend.settings import override_settings, reload_settings, settings
from candle_web.core.errors import CandleError, UnsupportedError


def test_an_override_wins_over_the_environment_and_leaves_it_alone(monkeypatch):
    monkeypatch.setenv("CANDLE_WEB_BACKEND", "numpy")
    monkeypatch.setenv("CANDLE_WEB_WHISPER_F16", "0")
    reload_settings()
    assert settings().cpu_backend == "numpy" and not settings().whisper_f16
    now = override_settings(cpu_backend="wasm")
    assert now is settings() and now.cpu_backend == "wasm"
    assert not now.whisper_f16, "a switch not named keeps the environment's value"
    assert os.environ["CANDLE_WEB_BACKEND"] == "numpy"
    assert _default_cpu_backend_name() == "wasm"
    reload_settings()
    assert settings().cpu_backend == "numpy", "reload_settings drops the overrides"


@pytest.mark.parametrize("values, error, message", [
    ({"cpu_backend": "tpu"}, CandleError, "cpu_backend='tpu'"),
    ({"decode_threads": 0}, UnsupportedError, "decode_threads=0"),
    ({"prompt_weights_bytes": float("nan")}, UnsupportedError, "prompt_weights_bytes=nan"),
    ({"no_such_switch": 1}, CandleError, "no_such_switch"),
])
def test_a_bad_override_is_refused_naming_it(values, error, message):
    before = settings()
    with pytest.raises(error, match=message):
        override_settings(**values)
    assert settings() == before
