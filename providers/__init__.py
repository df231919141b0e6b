"""The AI gateway: provider protocol, OpenAI-compatible client, synthetic provider, safety, keys."""
