"""Strict serializability testing on a list-append workload: a history checker after Elle
(:mod:`.checker`) and a live workload against a Spindle server (:mod:`.workload`)."""
