"""The provider-neutral recovery engine; imports nothing from Django (docs/architecture.md)."""
