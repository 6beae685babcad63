"""math-verify off the main thread, in a child process that can be stopped.

math-verify bounds its own time with ``signal.alarm``, which Python allows only on the main thread. A reward computed
elsewhere (an asyncio executor thread, a thread pool of a trainer that imports mmrl's rewards) had no bound: a short
answer such as ``10^{10^{10^{10}}}`` makes sympy build a number with 10^10 digits and holds the GIL until it is done.
Here such calls go to one child process, where math-verify runs on the child's main thread with its own timeouts,
and the caller waits at most ``timeout`` seconds; a child that does not answer in time is killed and the next call
starts a new one. Calls from several threads are served one at a time.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

Check = Callable[[str, str], tuple[bool, "str | None"]]


def _serve(connection: Connection, check: Check) -> None:
    """The child: answer ``(predicted, gold)`` requests with ``check``'s ``(match, reason)`` until the pipe closes."""
    while True:
        try:
            predicted, gold = connection.recv()
        except (EOFError, OSError):
            return
        try:
            result = check(predicted, gold)
        except Exception as exc:  # noqa: BLE001  (the reward contract: a verifier failure scores 0 with a reason)
            result = (False, f"verifier error: {type(exc).__name__}")
        connection.send(result)


class IsolatedVerifier:
    """``check(predicted, gold)`` run in a child process, at most ``timeout`` seconds per call from the caller's side.

    ``check`` must be a module-level function (the child is spawned, not forked: forking a process with threads can
    copy a held lock into the child)."""

    def __init__(self, check: Check, timeout: float):
        self.check, self.timeout = check, timeout
        self._lock = threading.Lock()
        self._process: Any = None
        self._connection: Connection | None = None

    def __call__(self, predicted: str, gold: str) -> tuple[bool, str | None]:
        with self._lock:
            try:
                connection = self._ensure_started()
            except (AssertionError, OSError) as exc:  # e.g. a daemonic pool worker may not have children
                return False, f"could not start the verifier process ({exc})"
            try:
                connection.send((predicted, gold))
                if connection.poll(self.timeout):
                    return connection.recv()
            except (EOFError, OSError) as exc:
                self._stop()
                return False, f"the verifier process failed ({type(exc).__name__})"
            self._stop()  # still busy: it may hold its GIL for hours; a new child serves the next call
            return False, f"verifier timed out after {self.timeout:g} s"

    def _ensure_started(self) -> Connection:
        if self._process is None or not self._process.is_alive():
            self._stop()
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(child, self.check), daemon=True,
                                      name="mmrl-math-verify")
            process.start()
            child.close()
            self._process, self._connection = process, parent
            log.debug("started the math-verify process (pid %s)", process.pid)
        assert self._connection is not None
        return self._connection

    def _stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)
        self._process, self._connection = None, None

    def close(self) -> None:
        with self._lock:
            self._stop()
