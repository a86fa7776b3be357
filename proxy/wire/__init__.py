"""What every connection of the proxy stands on: a protocol's flow control and the rest of
aiohttp past its public API (``seam``, the one module that reaches there), and the Date it
writes (``dates``)."""
