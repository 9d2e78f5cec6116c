"""Where an experiment's independent simulations run (``hops experiment``'s
``--workers`` and ``--ray``): one after another in this process, in
``workers`` local processes, or as Ray tasks: on an existing Ray cluster,
or on a private one started for the experiment on loopback (``--ray local``).

Both parallel ways are a :class:`concurrent.futures.Executor`, and every
experiment hands its runs to :func:`run_all`, so each of them runs the same
way whichever it is. Ray is an
optional extra (``hops-scheduler[ray]``), imported only when ``--ray`` is
given. Every run is a pure function of its arguments (the seeds are among
them), so where it runs does not change a digit of its result.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec

K = TypeVar("K")
R = TypeVar("R")

# The first-party packages a simulation imports: shipped to the Ray cluster
# with every run (runtime_env py_modules), so that its nodes need only the
# third-party distributions of constraints.txt, never a checkout of Hops.
SHIPPED = ("estimation", "experiments", "scheduling", "shared", "simulator", "world")
RAY_MISSING = "ray_missing"
RAY_UNREACHABLE = "ray_unreachable"
BAD_WORKERS = "bad_workers"
PROBE_S = 5.0  # seconds an explicit address has to accept a connection
LOCAL = "local"  # --ray local: a private Ray started here, on loopback, for the runs
# Ray advertises the machine's external address unless this is 0 (issue 36);
# a private Ray then stays on loopback, reachable from this machine alone.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class PoolError(Exception):
    """The runs cannot start where asked: ``code`` is stable, ``error`` says why."""

    def __init__(self, code: str, error: str) -> None:
        super().__init__(f"{code}: {error}")
        self.code = code
        self.error = error


class Pool(msgspec.Struct, frozen=True):
    """``workers``: local processes at once (1: one run after another, here);
    ``ray``: the Ray cluster to run on instead, ``auto`` (the one this
    machine belongs to), its ``host:port``, or ``local`` (a private one,
    started on loopback and stopped at the end, of ``workers`` CPUs, or of
    all this machine's when ``workers`` is 1)."""

    workers: int = 1
    ray: str | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise PoolError(BAD_WORKERS, f"--workers must be at least 1, not {self.workers}")

    @property
    def parallel(self) -> bool:
        """Whether the runs go to an executor (not one after another, here)."""
        return self.ray is not None or self.workers > 1


HERE = Pool()  # one run after another, in this process


class RayExecutor(Executor):
    """Each submitted call is one Ray task on the cluster at ``address``; the
    driver connects once and disconnects at shutdown (the cluster stays,
    unless it is the private one of ``local``, which stops with it)."""

    def __init__(self, address: str, cpus: int | None = None) -> None:
        self._ray = _import_ray()
        _probe(address)
        local: dict[str, Any] = {}
        if address == LOCAL:
            os.environ.update(LOOPBACK_ENV)  # read by the Ray processes started below
            local = {"num_cpus": cpus, "_node_ip_address": "127.0.0.1",
                     "include_dashboard": False}
        try:
            self._ray.init(address=address, runtime_env={"py_modules": _shipped(),
                                                        "excludes": ["__pycache__"]},
                           logging_level=logging.WARNING, log_to_driver=False,
                           configure_logging=False, **local)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise PoolError(RAY_UNREACHABLE,
                            f"no Ray cluster at {address!r} answered ({exc})") from None
        self._remote: dict[Callable[..., Any], Any] = {}

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(fn)
        future: Future[R] = remote.remote(*args, **kwargs).future()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._ray.shutdown()


def _probe(address: str, timeout_s: float = PROBE_S) -> None:
    """Refuse at once an explicit address where nothing listens: ``ray.init``
    would wait there for minutes (``auto`` looks up a local cluster and
    fails fast by itself; ``local`` starts one)."""
    if address in ("auto", LOCAL):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise PoolError(RAY_UNREACHABLE,
                        f"--ray takes auto, local or HOST:PORT, not {address!r}")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout_s).close()
    except OSError as exc:
        raise PoolError(RAY_UNREACHABLE, f"no Ray cluster at {address!r} answered "
                        f"within {timeout_s:g} s ({exc})") from None


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise PoolError(RAY_MISSING, f"--ray needs Ray, which is not installed ({exc}); "
                        "install hops-scheduler[ray] (the version of constraints.txt, "
                        "the cluster's own)") from None


def _shipped() -> list[str]:
    return [str(Path(importlib.import_module(name).__file__ or "").parent)
            for name in SHIPPED]


def check(pool: Pool) -> None:
    """Fails now, before any work, if ``pool`` asks for Ray and it is missing."""
    if pool.ray is not None:
        _import_ray()


@contextmanager
def executor(pool: Pool) -> Iterator[Executor]:
    """The executor of a parallel ``pool``, shut down on leaving."""
    cpus = pool.workers if pool.workers > 1 else None
    ex: Executor = (RayExecutor(pool.ray, cpus) if pool.ray is not None
                    else ProcessPoolExecutor(max_workers=pool.workers))
    with ex:
        yield ex


def run_keyed(pool: Pool, fn: Callable[..., R], calls: Mapping[K, tuple[Any, ...]],
              done: Callable[[K], None] | None = None) -> dict[K, R]:
    """``fn(*args)`` for each key's arguments, all submitted at once to the
    executor of ``pool``; the results by key, in ``calls``' order. ``done``
    is told each key as its result is taken."""
    with executor(pool) as ex:
        futures = {key: ex.submit(fn, *args) for key, args in calls.items()}
        results: dict[K, R] = {}
        for key, future in futures.items():
            results[key] = future.result()
            if done is not None:
                done(key)
        return results


def run_all(pool: Pool, fn: Callable[..., R], calls: Mapping[K, tuple[Any, ...]],
            done: Callable[[K], None] | None = None,
            here: Callable[..., R] | None = None) -> dict[K, R]:
    """``fn(*args)`` for each key's arguments, where ``pool`` says: one after
    another in this process (by ``here`` when given: ``fn`` with what only
    this process can do, such as progress bars), else :func:`run_keyed`.
    The results by key, in ``calls``' order, the same whichever way."""
    if pool.parallel:
        return run_keyed(pool, fn, calls, done)
    results: dict[K, R] = {}
    for key, args in calls.items():
        results[key] = (here or fn)(*args)
        if done is not None:
            done(key)
    return results
