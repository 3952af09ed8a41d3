"""The command line: the driver behind ``manage.py streamrecover_run`` and its terminal view."""
