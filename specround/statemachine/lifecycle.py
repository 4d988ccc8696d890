"""The round lifecycle as a data table for ``transitions`` (contract#round-transaction).

```
ROUND_READY -> VERIFIED_TEMPORARY -> DECIDED -> STAGED -> PUBLISHED
     |                 |                |          |
     +-----------------+----------------+----------+----> ABORTED   (any phase before PUBLISHED)
```

:data:`LIFECYCLE_TRANSITIONS` is the single source of truth: the controller's one long-lived
:class:`transitions.Machine` is built from it (``transitions`` checks the table: known states, no shortcut
transitions, invalid triggers raise), and :func:`next_phase` (used for the per-round phase of each request
inside a step) reads the same table. A **step** drives the rounds of a whole batch through the lifecycle
together — one trigger per phase, not one per round — while each round keeps its own phase: a round that
fails validation, hits a fault or loses the fence moves to ``ABORTED`` alone and the rest of the step
proceeds.

A step fires its triggers through a :class:`LifecycleDispatch` compiled once from the machine's events
(destination and ``before`` callbacks per source and trigger). Firing through ``transitions`` itself cost
some 15 µs per trigger (its event queue, callback resolution and logging), about a tenth of a one-request
step; the compiled table fires with one dictionary look-up and keeps the machine's semantics: a ``before``
callback that raises leaves the phase where it was, and a trigger the table does not allow raises.

The durable append runs in the ``before`` callback of ``publish`` (``write_publication``): if it raises,
``transitions`` leaves the state at ``STAGED`` and the caller aborts. Nothing durable ever happens in an
``on_enter`` callback, because ``transitions`` does not roll a state change back when ``on_enter`` raises.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, Final

from transitions import Machine

from specround.errors import IllegalTransitionError

__all__ = [
    "LIFECYCLE_TRANSITIONS",
    "PUBLISH_CALLBACK",
    "LifecycleDispatch",
    "RoundPhase",
    "Trigger",
    "build_lifecycle_machine",
    "next_phase",
]


class RoundPhase(Enum):
    """The states of one round (and of the step that carries it)."""

    ROUND_READY = "round_ready"
    """The proposal is bound to the round coordinate; S_0 is frozen."""
    VERIFIED_TEMPORARY = "verified_temporary"
    """Target rows and the branch K/V exist; nothing authoritative changed."""
    DECIDED = "decided"
    """A, the terminal kind and the emitted suffix are fixed."""
    STAGED = "staged"
    """The successor is assembled off to the side and validated by token identities."""
    PUBLISHED = "published"
    """The generation fence moved; the successor is authoritative."""
    ABORTED = "aborted"
    """Nothing was published; S_0 remains authoritative (INV-7)."""

    @property
    def terminal(self) -> bool:
        """Whether no trigger leaves this phase."""
        return self in (RoundPhase.PUBLISHED, RoundPhase.ABORTED)


class Trigger:
    """Trigger names of the lifecycle table."""

    VERIFY: Final = "verify"
    DECIDE: Final = "decide"
    STAGE: Final = "stage"
    PUBLISH: Final = "publish"
    ABORT: Final = "abort"


PUBLISH_CALLBACK: Final = "write_publication"
"""Name of the model method ``transitions`` calls *before* entering ``PUBLISHED`` (the durable append)."""

_BEFORE_PUBLISHED = [
    RoundPhase.ROUND_READY,
    RoundPhase.VERIFIED_TEMPORARY,
    RoundPhase.DECIDED,
    RoundPhase.STAGED,
]

LIFECYCLE_TRANSITIONS: Final[list[dict[str, Any]]] = [
    {"trigger": Trigger.VERIFY, "source": RoundPhase.ROUND_READY, "dest": RoundPhase.VERIFIED_TEMPORARY},
    {"trigger": Trigger.DECIDE, "source": RoundPhase.VERIFIED_TEMPORARY, "dest": RoundPhase.DECIDED},
    {"trigger": Trigger.STAGE, "source": RoundPhase.DECIDED, "dest": RoundPhase.STAGED},
    {
        "trigger": Trigger.PUBLISH,
        "source": RoundPhase.STAGED,
        "dest": RoundPhase.PUBLISHED,
        "before": PUBLISH_CALLBACK,
    },
    {"trigger": Trigger.ABORT, "source": _BEFORE_PUBLISHED, "dest": RoundPhase.ABORTED},
]
"""The lifecycle as data: one dict per transition, in the form ``transitions.Machine`` accepts."""


def _compile(table: list[dict[str, Any]]) -> dict[tuple[RoundPhase, str], RoundPhase]:
    compiled: dict[tuple[RoundPhase, str], RoundPhase] = {}
    for row in table:
        sources = row["source"] if isinstance(row["source"], list) else [row["source"]]
        for source in sources:
            compiled[(source, row["trigger"])] = row["dest"]
    return compiled


_NEXT: Final = _compile(LIFECYCLE_TRANSITIONS)


def next_phase(phase: RoundPhase, trigger: str) -> RoundPhase:
    """The phase ``trigger`` leads to from ``phase``; :class:`IllegalTransitionError` if the table forbids."""
    try:
        return _NEXT[(phase, trigger)]
    except KeyError:
        raise IllegalTransitionError(f"trigger {trigger!r} is not allowed in phase {phase.name}") from None


def build_lifecycle_machine() -> Machine:
    """The long-lived machine of one controller, with no model yet (steps attach theirs).

    ``auto_transitions`` is off (no ``to_<state>`` shortcuts) and invalid triggers raise, so the table is
    the only way a phase changes.
    """
    return Machine(
        model=None,
        states=RoundPhase,
        transitions=LIFECYCLE_TRANSITIONS,
        initial=RoundPhase.ROUND_READY,
        auto_transitions=False,
        ignore_invalid_triggers=False,
    )


def _phase(machine: Machine, name: str) -> RoundPhase:
    """The :class:`RoundPhase` a machine state name stands for."""
    value = machine.get_state(name).value
    if not isinstance(value, RoundPhase):
        raise ValueError(f"state {name!r} is not a RoundPhase")
    return value


class LifecycleDispatch:
    """The machine's transitions as a look-up table: (phase, trigger) -> (destination, ``before`` names).

    Compiled from a :class:`transitions.Machine`'s events, so it holds exactly what the machine would do;
    only plain destinations and ``before`` callbacks are supported (the lifecycle uses nothing else, and a
    machine with conditions, ``after``/``prepare`` callbacks or state callbacks is refused).
    """

    __slots__ = ("_table",)

    def __init__(self, machine: Machine) -> None:
        table: dict[tuple[RoundPhase, str], tuple[RoundPhase, tuple[str, ...]]] = {}
        hooks = (
            machine.before_state_change,
            machine.after_state_change,
            machine.prepare_event,
            machine.finalize_event,
            machine.on_exception,
        )
        if any(hooks) or any(state.on_enter or state.on_exit for state in machine.states.values()):
            raise ValueError("the lifecycle machine has callbacks a compiled dispatch does not run")
        for trigger, event in machine.events.items():
            for source, moves in event.transitions.items():
                if len(moves) != 1:
                    raise ValueError(f"trigger {trigger!r} has {len(moves)} transitions from {source}")
                [move] = moves
                if move.after or move.prepare or move.conditions:
                    raise ValueError(f"trigger {trigger!r} from {source} has callbacks beyond 'before'")
                names = tuple(name for name in move.before if isinstance(name, str))
                if len(names) != len(move.before) or move.dest is None:
                    raise ValueError(
                        f"trigger {trigger!r} from {source} is internal or has a non-method callback"
                    )
                table[(_phase(machine, source), trigger)] = (_phase(machine, move.dest), names)
        self._table = table

    def fire(self, model: object, phase: RoundPhase, trigger: str) -> RoundPhase:
        """Run ``trigger``'s ``before`` callbacks on ``model``; the phase it leads to from ``phase``.

        :class:`~specround.errors.IllegalTransitionError` if the table forbids it. A callback that raises
        propagates, and the caller keeps ``phase`` (nothing was entered).
        """
        try:
            dest, before = self._table[(phase, trigger)]
        except KeyError:
            raise IllegalTransitionError(
                f"trigger {trigger!r} is not allowed in phase {phase.name}"
            ) from None
        for name in before:
            callback: Callable[[], object] = getattr(model, name)
            callback()
        return dest

    def moves(self) -> dict[tuple[RoundPhase, str], RoundPhase]:
        """Every allowed (phase, trigger) and the phase it leads to."""
        return {key: dest for key, (dest, _) in self._table.items()}
