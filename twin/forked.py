"""One computation in a forked process, while this one goes on with another.

For two independent simulations of one command (the two short steps of
twin.micro_batches) on a machine with a core to spare. A forked child
inherits everything built so far (model, machine, routes) without pickling;
only its result comes back, pickled, through a pipe. Where fork is not
available the computation runs here when its result is asked for.
"""

from __future__ import annotations

import multiprocessing
import signal
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Forked(Generic[T]):
    """`compute()` started in a forked child; `result()` waits for it and returns its value or raises its error."""

    def __init__(self, compute: Callable[[], T]) -> None:
        self._compute = compute
        self._process = None
        if "fork" not in multiprocessing.get_all_start_methods():
            return
        context = multiprocessing.get_context("fork")
        self._receive, send = context.Pipe(duplex=False)

        def child() -> None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # on Ctrl-C the parent ends it (close), quietly
            try:
                outcome = (True, compute())
            except BaseException as error:  # noqa: BLE001 -- raised again in the parent by result()
                outcome = (False, error)
            send.send(outcome)

        self._process = context.Process(target=child, daemon=True)
        self._process.start()
        send.close()

    def result(self) -> T:
        if self._process is None:
            return self._compute()
        try:
            ok, value = self._receive.recv()
        except EOFError:
            raise RuntimeError(f"a forked computation ended without a result (exit code "
                               f"{self._process.exitcode})") from None
        finally:
            self.close()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Ends the child if it still runs (this process no longer needs its result) and waits for it."""
        if self._process is None:
            return
        self._process.terminate()
        self._process.join()
        self._receive.close()
        self._process = None
