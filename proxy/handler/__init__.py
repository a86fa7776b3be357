"""A request carried out: routed, planned by the engine, answered from a tier or fetched,
stored, revalidated, sliced; the compiled plain hit (``hitpath/``)."""
