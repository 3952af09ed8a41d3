"""The demo chat app: log in, chat with the fake provider, pick a fault and watch the recovery."""
