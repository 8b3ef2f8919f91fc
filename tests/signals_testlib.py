"""Children that a test stops with SIGINT (Ctrl-C), as a terminal would."""
from __future__ import annotations

import signal


def default_sigint() -> None:
    """A child's preexec_fn: SIGINT back to its default disposition. A shell starts background
    jobs with SIGINT ignored (a `make test &` from a script did), a child inherits that, and
    Python then installs no KeyboardInterrupt handler: the test's Ctrl-C would never reach the
    program (a fresh clone's chat test timed out so, and two Ray servers sat out their 60 s
    stop timeouts)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
