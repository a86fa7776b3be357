"""The offline simulation: one tier or two, sampled and split sweeps, the flash question, a
sweep on a cluster."""
