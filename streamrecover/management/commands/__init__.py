"""The ``streamrecover_*`` management commands."""
