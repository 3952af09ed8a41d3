"""streamrecover: keeps streamed LLM chats and agent runs alive when the provider's stream breaks."""
