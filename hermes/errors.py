"""The root of hermes-batch's errors: each says what kind of failure it is and whether it passes.

    class EngineTimeout(SandboxError):
        kind = "engine time-out"   # how reports group the failure (statistics.json, `hermes-batch status`)
        transient = True           # the same work, tried again later, may well succeed

A class whose instances differ keeps kind None and lets each instance say (ModelError: the
endpoint's status, `ModelError(text, kind="model endpoint 429", transient=True)`); a failure whose
kind is None is grouped by its text (hermes.data.failures), as journals written before kinds were.
The product's error classes keep their builtin bases too (ValueError, LookupError, RuntimeError),
so callers that catch those still do.
"""
from __future__ import annotations


class HermesError(Exception):
    """An error of hermes-batch's own."""

    #: the failure's group in reports; None: grouped by its text
    kind: str | None = None
    #: whether the same work may well succeed if tried again later
    transient: bool = False

    def __init__(self, *args: object, kind: str | None = None, transient: bool | None = None) -> None:
        super().__init__(*args)
        if kind is not None:
            self.kind = kind
        if transient is not None:
            self.transient = transient

    def __reduce__(self):
        # pickled (Dask, worker processes) with what the instance said, not only its class's defaults
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[HermesError], args: tuple, state: dict) -> HermesError:
    e = cls.__new__(cls, *args)
    Exception.__init__(e, *args)
    e.__dict__.update(state)
    return e
