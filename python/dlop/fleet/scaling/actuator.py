"""What the autoscaling controller asks of a scheduler: an :class:`Actuator`.

An actuator owns the offloaders it starts, and nothing else: the controller
(dlop.fleet.scaling.controller) decides the fleet's size from the trainers'
figures and calls :meth:`Actuator.scale`; the actuator starts or stops
offloaders toward it through its scheduler (local processes, SLURM jobs, a
Kubernetes Deployment, Ray actors). New offloaders join the trainers through discovery
(the fleet's c10d store, or DNS), never through the actuator.
"""

from __future__ import annotations

import abc


class ActuatorError(RuntimeError):
    """The scheduler refused or failed a change (sbatch failed, the API said no). The message
    names the scheduler, what was asked and its answer; the fleet stays as it was."""


class Actuator(abc.ABC):
    """Starts and stops offloaders; driven from one thread (the controller's)."""

    #: the scheduler's name in messages: "local", "slurm", "kubernetes", "ray"
    name: str = "?"

    @property
    @abc.abstractmethod
    def floor(self) -> int:
        """Offloaders the actuator did not start and never stops (a SLURM het job's fixed group)."""

    @property
    def capacity(self) -> int | None:
        """The most offloaders it can have (the cores a host leaves), None: no limit it knows."""
        return None

    @abc.abstractmethod
    def size(self) -> int:
        """Offloaders asked for and not stopped: running, starting or pending, the floor included."""

    @abc.abstractmethod
    def scale(self, target: int) -> str:
        """Starts or stops offloaders until :meth:`size` is ``max(target, floor)``; returns what it
        did, in a line. Raises :class:`ActuatorError` when the scheduler fails; what it changed
        before the failure stays changed, and :meth:`size` says so."""

    def check(self) -> list[str]:
        """Problems seen since the last call (an offloader that never started, one that died), a line
        each; the actuator has already dropped such offloaders from :meth:`size`."""
        return []

    def close(self) -> None:
        """Stops every offloader it started (draining them: SIGTERM), never the floor."""
