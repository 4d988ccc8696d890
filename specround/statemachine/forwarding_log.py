"""An :class:`~specround.statemachine.ports.EventLog` that forwards every call to the log it wraps.

A wrapper that watches or gates one call (the time spent publishing, a publish held at a gate) subclasses
it and overrides only that call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from specround.statemachine.events import RequestOpened
from specround.statemachine.ports import EventLog, LogHead, PublishOutcome, RoundPublication, StoredEvent

__all__ = ["ForwardingLog"]


class ForwardingLog:
    """Forwards each :class:`EventLog` call to ``inner``."""

    def __init__(self, inner: EventLog) -> None:
        self.inner = inner
        """The wrapped log."""

    def open_request(self, event: RequestOpened, state_digest: str) -> None:
        """Forwarded."""
        self.inner.open_request(event, state_digest)

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        """Forwarded."""
        return self.inner.publish(publications)

    def events(self, request_id: str | None = None) -> Iterator[StoredEvent]:
        """Forwarded."""
        return self.inner.events(request_id)

    def request_ids(self) -> list[str]:
        """Forwarded."""
        return self.inner.request_ids()

    def head(self, request_id: str) -> LogHead | None:
        """Forwarded."""
        return self.inner.head(request_id)

    def close(self) -> None:
        """Forwarded."""
        self.inner.close()
