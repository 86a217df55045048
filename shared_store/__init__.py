"""shared_store."""
