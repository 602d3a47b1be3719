"""SIGINT/SIGTERM during a wave: the first one stops it in order, a second one at once (still leaving nothing
running). Only the main thread can take signals; elsewhere (a wave run from a thread) nothing is installed."""
from __future__ import annotations

import signal
import threading
from typing import Callable


class Signals:
    def __init__(self, first: Callable[[str], None], again: Callable[[str], None]):
        """`first(name)`: stop the wave in order; `again(name)`: stop it at once (it does not return)."""
        self.first = first
        self.again = again
        self.received: str | None = None

    def install(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def restore(previous: dict) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received:
            self.again(name)
        self.received = name
        self.first(name)
