"""Control plane: typed msgpack messages over length-prefixed asyncio streams."""
