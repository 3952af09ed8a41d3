"""Runs: their lifecycle (state changes), their execution, and what they leave behind.

``lifecycle`` changes a run's state and starts nothing; ``execution`` executes one claimed
run; ``recorder`` and ``checkpoints`` are the sinks and stores it writes through. The code
that starts work (``streamrecover.dispatch``, ``streamrecover.tasks``) sits above this package.
"""
