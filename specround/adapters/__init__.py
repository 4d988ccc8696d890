"""The outside world: the SQL event log and torch models/proposers, implementing the domain's ports."""
