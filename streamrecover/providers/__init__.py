"""Provider adapters, one per wire format, and the registry that finds them."""
