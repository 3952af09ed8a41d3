"""streamrecover: keeps streamed LLM chats and agent runs alive when the provider's stream breaks."""

# The one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic), and
# CHANGELOG.md names it; tests/test_packaging.py checks the built wheel's metadata against it.
__version__ = "0.1.0"
