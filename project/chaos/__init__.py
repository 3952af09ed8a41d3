"""The chaos harness: the distributed stack under random kills, restarts and faults, then its promises checked."""
