"""What both reading schedules do on a long run: :class:`LongRunSchedule`, the base of the device watcher's
:class:`~torchmem.capture.watch_stride.ReadingSchedule` and the host watcher's
:class:`~torchmem.capture.host_schedule.HostSchedule`.

A long run *relaxes* its schedule (after ``relax_after`` readings its stride is chosen for a smaller share of
a step: ``torchmem run``'s watchers read as rarely as every 256 steps on the device, 1,024 on the host), and a
relaxed schedule is *alerted* by a reading that rose at the leak threshold's rate: it reads
:data:`ALERT_FACTOR` times as often for the next :data:`ALERT_READINGS` readings, renewed by each reading that
rises again, then returns to the stride it chooses. A leak that starts late in a long run so gets the
readings of a verdict within a few relaxed strides (CI under load, session 17: a 512 KiB/step leak over the
last 400 of 1,700 CPU steps had one reading at the widest stride and was called "noisy"); a flat run never
pays for it, a figure that rises once pays for :data:`ALERT_READINGS` readings, and while the figure keeps
rising the readings cost :data:`ALERT_FACTOR` x the relaxed share.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

ALERT_READINGS = 8
ALERT_FACTOR = 8


class LongRunSchedule(ABC):
    """The relaxed and alerted states of a reading schedule.

    A subclass keeps :attr:`readings` (the readings that count towards ``relax_after``), :attr:`stride`, and
    says how the stride narrows (:meth:`_narrow`) and what it returns to (:meth:`_alert_ended`); it calls
    :meth:`_count_reading` once per reading.
    """

    stride: int

    def __init__(self, share: float) -> None:
        self.readings = 0
        self.relax_after: int | None = None
        self.relaxed_share = share
        self._alert_left = 0  # readings left at the alerted stride

    def relax(self, after: int | None, share: float) -> None:
        """After ``after`` readings (``None``: never), read within ``share`` of a step instead."""
        self.relax_after = after
        self.relaxed_share = share

    @property
    def relaxed(self) -> bool:
        """Whether the stride is a long run's now, chosen for :attr:`relaxed_share`."""
        return self.relax_after is not None and self.readings >= self.relax_after and self._may_relax()

    @property
    def alerted(self) -> bool:
        """Whether the readings are taken at the alerted stride now (see :meth:`alert`)."""
        return self._alert_left > 0

    def alert(self) -> None:
        """The last reading rose at the leak threshold's rate or more: a relaxed schedule reads
        :data:`ALERT_FACTOR` times as often for the next :data:`ALERT_READINGS` readings (a reading that
        rises again renews them, not narrower still). A schedule that is not relaxed is left as it is."""
        if not self.relaxed:
            return
        if not self._alert_left:
            k = max(1, self.stride // ALERT_FACTOR)
            if k >= self.stride:
                return
            self._narrow(k)
        self._alert_left = ALERT_READINGS

    def _count_reading(self) -> None:
        """One reading more; the alert's last one returns the schedule to its own stride."""
        self.readings += 1
        if self._alert_left:
            self._alert_left -= 1
            if not self._alert_left:
                self._alert_ended()

    def _may_relax(self) -> bool:
        return True

    @abstractmethod
    def _narrow(self, k: int) -> None:
        """Read every ``k`` steps for the alert, keeping what to return to."""

    @abstractmethod
    def _alert_ended(self) -> None:
        """The alert's last reading was taken: back to the schedule's own stride."""


__all__ = ["ALERT_FACTOR", "ALERT_READINGS", "LongRunSchedule"]
