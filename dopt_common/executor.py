"""Where trial segments run: in this process (``--parallel 1`` without Ray), or as Ray tasks.

Ray does the scheduling and placement (one CPU, or ``gpus_per_trial`` GPUs, per task; a local instance by
default, a cluster through ``address``). The search only submits segments and collects whichever finishes first.
On a cluster the output folder must be on storage every node sees (each trial resumes from its checkpoint there).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from dopt_common.deps import require
from dopt_common.errors import ConfigError
from dopt_common.signals import signals_held

log = logging.getLogger(__name__)

Key = Any
WAIT_S = 0.5  # how long one wait for a task lasts, so that a signal is seen this soon
CANCEL_GRACE_S = 20.0  # how long cancelled tasks have to clean up before they are killed
# [ray://]host[:port]: a host name or IPv4 address, or an IPv6 one in brackets; the port required without ray://
ADDRESS = re.compile(r"^(ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:(?P<port>\d{1,5}))?$")


class InProcessExecutor:
    """Runs each submitted call when its result is asked for, one at a time."""

    parallel = 1

    def __init__(self) -> None:
        self._pending: list[tuple[Key, Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, key: Key, fn: Callable[..., Any], *args: Any) -> None:
        self._pending.append((key, fn, args))

    def put(self, value: Any) -> Any:
        """A handle tasks receive as ``value`` (in-process: the object itself)."""
        return value

    def busy(self) -> int:
        return len(self._pending)

    def next_result(self) -> tuple[Key, Any]:
        """The next call's key and result, or the exception it raised."""
        key, fn, args = self._pending.pop(0)
        try:
            return key, fn(*args)
        except Exception as exc:  # noqa: BLE001  (a trial's own error ends that trial, not the search)
            return key, exc

    def close(self) -> None:
        self._pending.clear()


class RayExecutor:
    """Submits each call as a Ray task and returns results in the order they finish."""

    def __init__(self, parallel: int, address: str | None, gpus_per_trial: float) -> None:
        ray = require("ray", purpose="--parallel > 1 or --address (Ray tasks)", extra="search")
        self._ray = ray
        self.parallel = parallel
        try:
            with signals_held(ray):  # a signal during ray.init is raised once it returns
                if not ray.is_initialized() and address:
                    ray.init(address=address, log_to_driver=False)
                elif not ray.is_initialized():
                    ray.init(
                        num_cpus=parallel,
                        num_gpus=None if gpus_per_trial else 0,
                        include_dashboard=False,
                        log_to_driver=False,
                    )
        except BaseException:  # interrupted or failed start: what ray.init started (a local instance) goes too
            ray.shutdown()
            raise
        resources = ray.cluster_resources()
        log.info(
            "Ray: %s, %g CPUs, %g GPUs", address or "local instance", resources.get("CPU", 0), resources.get("GPU", 0)
        )
        if gpus_per_trial and resources.get("GPU", 0) < gpus_per_trial:
            raise ConfigError(
                f"--gpus-per-trial {gpus_per_trial:g} but the Ray cluster has "
                f"{resources.get('GPU', 0):g} GPUs; fix: pass 0, or an --address with GPUs"
            )
        self._options = {"num_cpus": 1, "num_gpus": gpus_per_trial, "max_retries": 0}
        self._remote: dict[Callable[..., Any], Any] = {}
        self._refs: dict[Any, Key] = {}

    def submit(self, key: Key, fn: Callable[..., Any], *args: Any) -> None:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(**self._options)(fn)
        self._refs[remote.remote(*args)] = key

    def busy(self) -> int:
        return len(self._refs)

    def put(self, value: Any) -> Any:
        """``value`` in Ray's object store, once: every task given the handle reads that one copy."""
        return self._ray.put(value)

    def next_result(self) -> tuple[Key, Any]:
        """The first task to finish: its key and result, or the exception it raised."""
        done: list[Any] = []
        while not done:  # short waits: a signal noted during one is raised between them, in Python
            with signals_held():
                done, _ = self._ray.wait(list(self._refs), num_returns=1, timeout=WAIT_S)
        key = self._refs.pop(done[0])
        try:
            return key, self._ray.get(done[0])
        except Exception as exc:  # noqa: BLE001  (RayTaskError wraps the trial's own error)
            return key, getattr(exc, "cause", None) or exc

    def close(self) -> None:
        """Cancel the tasks still running, then stop Ray. Each first gets a KeyboardInterrupt, so its finally
        blocks remove its staging folder and lock; one still running ``CANCEL_GRACE_S`` later is killed."""
        refs = list(self._refs)
        self._refs.clear()
        with signals_held():  # a second Ctrl-C must not cut the cleanup short
            for ref in refs:
                self._ray.cancel(ref, force=False)
            _, stuck = self._ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S) if refs else ([], [])
            for ref in stuck:
                self._ray.cancel(ref, force=True)
            self._ray.shutdown()


def check_address(address: str | None, field: str = "--address") -> str | None:
    """``address`` when it has a form ``ray.init`` accepts (``auto``, ``host:port``, ``[ipv6]:port``,
    ``ray://host[:port]``); a ConfigError naming ``field`` otherwise, raised before Ray starts."""
    if address is None or address in ("auto", "local"):
        return address
    match = ADDRESS.match(address)
    port = match and match.group("port")
    if match and (0 < int(port) < 65536 if port else address.startswith("ray://")):  # Ray Client has a default
        return address
    raise ConfigError(
        f"{field} '{address}' is not a Ray address; fix: give the head node's host:port (e.g. 10.0.0.5:6379), "
        "ray://host:10001 for Ray Client, or auto"
    )


def make_executor(parallel: int, address: str | None, gpus_per_trial: float) -> InProcessExecutor | RayExecutor:
    """In-process for ``--parallel 1`` without an address when Ray is absent; Ray otherwise."""
    check_address(address)
    if parallel < 1:
        raise ConfigError(f"--parallel must be >= 1, got {parallel}")
    if gpus_per_trial < 0:
        raise ConfigError(f"--gpus-per-trial must be >= 0, got {gpus_per_trial}")
    if parallel == 1 and address is None and gpus_per_trial == 0:
        return InProcessExecutor()
    return RayExecutor(parallel, address, gpus_per_trial)


def scatter(executor: InProcessExecutor | RayExecutor, fn: Callable[[Any, Any], Any], shared: Any, items: list) -> list:
    """``fn(shared, item)`` for every item, results in the items' order; ``shared`` is shipped once (the object
    store on Ray), not once per task. The first error a task raised is raised here, after the rest finish."""
    handle = executor.put(shared)
    for index, item in enumerate(items):
        executor.submit(index, fn, handle, item)
    results: dict[int, Any] = {}
    while executor.busy():
        key, value = executor.next_result()
        results[key] = value
    errors = [results[i] for i in range(len(items)) if isinstance(results[i], BaseException)]
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(items))]
