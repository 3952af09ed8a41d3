"""Live delivery of a run's frames: publisher (worker side), replay buffer, WebSocket consumer.

The engine emits protocol frames through ``RunSink.on_frame``; ``publisher`` coalesces them,
keeps them in a bounded per-run ``buffer`` and sends them to the run's channel-layer group,
where ``consumer.RunConsumer`` forwards them to the browser (docs/protocol.md).
"""
