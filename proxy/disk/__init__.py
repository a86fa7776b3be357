"""The disk tier's files: the store over the core's ``DiskTier``, its directory, region files and
record meta."""
