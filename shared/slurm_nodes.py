"""What Slurm's node states mean to Hops (issue 37), and when Hops counts a
node alive or refuses a start there, as pure functions.

Slurm writes a node's state several ways: ``scontrol`` as ``IDLE+DRAIN`` or
``DOWN+NOT_RESPONDING``, ``sinfo`` as ``drained`` or ``down*``, its JSON as
a base state (``idle``) with flags (``["DRAIN"]``). :func:`node_health`
takes any of them. An unknown word never raises: it reads dead, with a code
saying it was not understood. Job states are :mod:`shared.slurm`.
"""

from __future__ import annotations

import msgspec

# Suffixes sinfo appends to a node's state: ``*`` not responding, ``~`` powered
# off, ``#`` powering up, ``%`` powering down, ``!`` power down pending,
# ``$`` in a maintenance reservation, ``@`` reboot pending, ``^`` rebooting,
# ``-`` planned by backfill. (shared.slurm strips them from a job's state too.)
STATE_SIGILS = "*~#%!$@^-"
_NOT_RESPONDING = "NOT_RESPONDING"
_DRAIN_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED"})
_BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
_UP = frozenset({"IDLE", *_BUSY})
_DEAD = frozenset({"DOWN", "ERROR", "FUTURE", "INVAL"})
# Slurm's UNKNOWN: "the controller has just started and the node's state has
# not yet been determined" (sinfo(1), NODE STATE CODES).
_UNDETERMINED = "UNKNOWN"
# sinfo's long forms fold a drain into the base word.
_ALIASES = {"DRAINED": ("IDLE", "DRAIN"), "DRAINING": ("ALLOCATED", "DRAIN"),
            "ALLOC": ("ALLOCATED", ""), "COMP": ("COMPLETING", ""),
            "DRAIN": ("IDLE", "DRAIN")}

NODE_UNKNOWN_STATE = "slurm_node_state_unknown"
# A node slurmctld has not heard from since it (re)started: not evidence of death.
NODE_UNDETERMINED = "undetermined"


class NodeHealth(msgspec.Struct, frozen=True):
    """A Slurm node as Hops reads it: ``alive`` (its slurmd answers and it is
    not down), ``drained`` (no new work: an operator or Slurm drained it),
    ``busy`` (jobs hold some of it), ``code`` (one stable word: ``idle``,
    ``busy``, ``down``, ``not_responding``, ``drained``,
    :data:`NODE_UNDETERMINED` or :data:`NODE_UNKNOWN_STATE`) and Slurm's
    ``reason``."""

    alive: bool
    drained: bool
    busy: bool
    code: str
    reason: str = ""


def _words(state: str, flags: tuple[str, ...]) -> tuple[str, set[str]]:
    """The base state and the flags of ``state`` (any of Slurm's spellings)."""
    text = state.strip().upper()
    extra = {f.strip().upper() for f in flags if f.strip()}
    if text.endswith("*"):
        extra.add(_NOT_RESPONDING)
    text = text.rstrip(STATE_SIGILS)
    base, *more = text.split("+") if text else [""]
    extra |= {m for m in more if m}
    base, folded = _ALIASES.get(base, (base, ""))
    if folded:
        extra.add(folded)
    return base, extra


def node_health(state: str, flags: tuple[str, ...] = (), reason: str = "") -> NodeHealth:
    """How Hops reads a Slurm node in ``state`` with ``flags``. A state it
    does not know reads as dead (no work is placed there) with the code
    :data:`NODE_UNKNOWN_STATE`."""
    base, extra = _words(state, flags)
    drained = bool(extra & _DRAIN_FLAGS)
    if base == _UNDETERMINED:
        return NodeHealth(alive=False, drained=drained, busy=False, code=NODE_UNDETERMINED,
                          reason=reason or "slurmctld has not yet heard from the node")
    if base in _DEAD or _NOT_RESPONDING in extra:
        code = "down" if base in _DEAD else "not_responding"
        return NodeHealth(alive=False, drained=drained, busy=False, code=code, reason=reason)
    if base not in _UP:
        return NodeHealth(alive=False, drained=drained, busy=False,
                          code=NODE_UNKNOWN_STATE, reason=reason or f"Slurm state {state!r}")
    busy = base in _BUSY
    code = "drained" if drained else "busy" if busy else "idle"
    return NodeHealth(alive=True, drained=drained, busy=busy, code=code, reason=reason)


# The rules the bridge judges its readings of a node by (docs/slurm.md,
# "Slurm's states become Hops' records and events"). Pure: the shell
# (executor.slurm) reads Slurm and the clock and hands both in; times are
# seconds of one clock (time.time() in the bridge).

NO_NODE = "slurm_no_node"
NODE_DOWN = "slurm_node_down"
NODE_DRAINED = "slurm_node_drained"


def dead_since_after(dead_since: float | None, health: NodeHealth,
                     read_at: float) -> float | None:
    """Since when a node reads dead, after a reading begun at ``read_at``
    that reads it ``health`` (None: it reads alive). A node slurmctld has
    not heard from since it restarted (:data:`NODE_UNDETERMINED`) neither
    starts nor ends a death: its last reading stands, and no new work goes
    there meanwhile (:func:`node_refusal`), unless it reads so for long
    (:func:`node_counted_alive`); without this, a restarted slurmctld's few
    seconds of UNKNOWN would kill every idle node."""
    if health.alive:
        return None
    if health.code == NODE_UNDETERMINED:
        return dead_since
    return read_at if dead_since is None else dead_since


# How many debounces a node may read UNKNOWN on end before it is dead all the
# same: a restarted slurmctld hears from its slurmds within seconds, and one it
# never hears from would otherwise stay alive, refusing every start, until
# Slurm sets it DOWN after SlurmdTimeout (300 s by default).
UNDETERMINED_DEBOUNCES = 10


def undetermined_since_after(since: float | None, health: NodeHealth,
                             read_at: float) -> float | None:
    """Since when a node reads UNKNOWN on end, after a reading begun at
    ``read_at`` that reads it ``health`` (None: it does not)."""
    if health.code != NODE_UNDETERMINED:
        return None
    return read_at if since is None else since


def node_counted_alive(listed: bool, read_at: float, dead_since: float | None,
                       down_s: float, undetermined_since: float | None = None) -> bool:
    """Whether Hops counts a node alive after a reading begun at ``read_at``
    (0: none yet): not when the reading no longer lists it in the partition,
    nor once Slurm has read it dead since ``dead_since`` (None: it reads
    alive) for ``down_s`` on end, nor once it has read UNKNOWN since
    ``undetermined_since`` for :data:`UNDETERMINED_DEBOUNCES` times that. A
    resumed node reads not responding for about a second (docs/slurm.md,
    "Quirks"): shorter deaths are not deaths."""
    if read_at and not listed:
        return False
    if undetermined_since is not None \
            and read_at - undetermined_since >= UNDETERMINED_DEBOUNCES * down_s:
        return False
    return dead_since is None or read_at - dead_since < down_s


def node_refusal(server: str, partition: str, read_at: float,
                 health: NodeHealth | None) -> tuple[str, str] | None:
    """Why a start on ``server`` is refused before any sbatch, as (code,
    words), from the latest reading of ``partition``'s nodes (begun at
    ``read_at``; 0: none yet, so nothing is known) and the node's
    ``health`` in it (None: not listed); None when Slurm has nothing against
    it. A node the reading does not list is :data:`NO_NODE` (sbatch would
    be refused, or the job would wait for a node that never comes); one
    read dead is refused at once (no debounce for new work); a drained one
    too."""
    if health is None and read_at:
        return NO_NODE, f"{server} is not a node of partition {partition}"
    if health is None:
        return None
    if not health.alive:
        return NODE_DOWN, (f"Slurm reads node {server} as {health.code}: "
                            f"{health.reason or 'no reason given'}")
    if health.drained:
        return NODE_DRAINED, (f"Slurm has drained node {server}: "
                               f"{health.reason or 'no reason given'}")
    return None
