"""Errors shared by the storage room."""


class StoreError(RuntimeError):
    """The object store could not be started, reached or used; the message says what to do."""

