"""Interrupting signals held over a section that must finish: noted while it runs, raised again once it ends.

Python runs a signal's handler in the main thread whichever thread the kernel delivered it to, and the kernel may
deliver a process-wide signal to any thread that does not block it (ONNX Runtime's, torch's, Ray's), so blocking
it in the calling thread (``pthread_sigmask``) is not enough: the handler is swapped for one that only notes it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

STOPPING = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held(ray: Any = None) -> Iterator[None]:
    """SIGINT and SIGTERM noted during the block, then the first of them raised again under the previous handlers.

    Outside the main thread (where no handler can be set) the block runs as it is. Given ``ray``, its handler
    installation is skipped for the block: ``ray.init`` installs a SIGTERM handler that calls ``sys.exit(15)``
    halfway through starting its processes, which would hide an interrupted run and orphan Ray's agents; and a
    handler that raises inside Ray's CoreWorker.wait comes out as a SystemError.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    ours = [signum for signum in STOPPING if signal.getsignal(signum) is not None]  # None: set outside Python
    previous = {signum: signal.signal(signum, lambda n, _f: noted.append(n)) for signum in ours}
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    installer = getattr(utils, "set_sigterm_handler", None)
    if installer is not None:
        utils.set_sigterm_handler = lambda _handler: None
    try:
        yield
    finally:
        if installer is not None:
            utils.set_sigterm_handler = installer
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if noted:
            signal.raise_signal(noted[0])
