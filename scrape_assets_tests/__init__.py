"""Tests of scrape_assets; shared helpers live here and in ``conftest.py``."""

import signal


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT (Ctrl-C).

    A shell starting ``make test &`` without job control (a CI script, ``nohup``) ignores
    SIGINT in it and its children, and a Python started with SIGINT ignored never raises
    KeyboardInterrupt: the child would not stop. This gives it the default disposition, so
    Python installs its Ctrl-C handler as it does at a terminal.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
