"""The Python half of the browser worker (web/worker.js), installed with the candle_web wheel.

The worker imports this package once and calls through it: `session_for(kind)` gives the
session of a model kind (models, load, and the kind's run command; session.py says how), and
`eval_twin` runs the twin check. The sessions' module-level imports are the standard library,
numpy and candle_web.core.errors: each loads its model code when it first builds a model, so the
page's start pays only for these few files.
"""
from __future__ import annotations

import json

from candle_web.worker.bert import BertSession
from candle_web.worker.faces import FaceSession
from candle_web.worker.llama import LlamaSession
from candle_web.worker.session import Session
from candle_web.worker.t5 import T5Session
from candle_web.worker.twin_check import eval_twin
from candle_web.worker.vad import VadSession
from candle_web.worker.whisper import WhisperSession

DEFAULT_KIND = "whisper"  # what a `load` or `models` without a kind means (the first view's)
SESSION_CLASSES = {"whisper": WhisperSession, "bert": BertSession, "llama": LlamaSession,
                   "t5": T5Session, "vad": VadSession, "faces": FaceSession}
# One session per kind for the worker's lifetime: each keeps its own loaded model.
_sessions: dict = {}


def session_for(kind=None) -> Session:
    """The worker's session for model `kind` (None: DEFAULT_KIND)."""
    from candle_web.core.errors import UnsupportedError

    kind = DEFAULT_KIND if kind is None else kind
    if not isinstance(kind, str) or kind not in SESSION_CLASSES:
        raise UnsupportedError(f"unknown model kind {json.dumps(kind, default=str)}; known: "
                               f"{', '.join(SESSION_CLASSES)}")
    if kind not in _sessions:
        _sessions[kind] = SESSION_CLASSES[kind]()
    return _sessions[kind]


__all__ = ["Session", "WhisperSession", "BertSession", "LlamaSession", "T5Session", "VadSession",
           "FaceSession", "session_for", "eval_twin", "DEFAULT_KIND", "SESSION_CLASSES"]
