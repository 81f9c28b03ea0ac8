"""``from spindle.concurrent import futures`` (or ``from spindle import concurrent``, then
``concurrent.futures``): the mirror of ``concurrent.futures``."""

from . import futures

__all__ = ["futures"]
