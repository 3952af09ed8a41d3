"""The healing endpoint: the providers' own APIs, served by the app, recovering broken streams in place."""
