"""An event log that forwards every call and keeps the publications it was asked to publish."""

from __future__ import annotations

from collections.abc import Sequence

from specround.statemachine.forwarding_log import ForwardingLog
from specround.statemachine.ports import EventLog, PublishOutcome, RoundPublication


class CapturingLog(ForwardingLog):
    """Forwards every call to ``inner`` and keeps, in ``sent``, every publication it was given."""

    def __init__(self, inner: EventLog) -> None:
        super().__init__(inner)
        self.sent: list[RoundPublication] = []

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        """Keep ``publications``, then publish them to the inner log."""
        self.sent.extend(publications)
        return self.inner.publish(publications)
