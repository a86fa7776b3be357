"""onehit, the caching reverse proxy. Its layers, each importing only those before it:

* ``core``: the cache policy (Bloom window, admission, store, HTTP caching rules); no I/O.
* ``config``: the settings, their parsers, the log names.
* ``front`` (the client connection), ``origin`` (the origin connections), ``disk`` (the disk
  tier's files), ``fleet`` (what instances share through Redis): each over core and config.
* ``handler``: a request carried out, from the route to the answer, over all of the above.
* ``ops``: the running service, its workers and its admin port.
"""
