"""The origin connections: the keep-alive pool, its connections and their compiled parser of
plain answers, aiohttp's client for the rest, and what is read of an origin body."""
