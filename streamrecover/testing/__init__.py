"""Tools for testing a project that uses streamrecover: the fake provider, the reference client, sample tools."""
