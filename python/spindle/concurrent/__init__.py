"""``from spindle.concurrent import futures``: the mirror of ``concurrent.futures``."""
