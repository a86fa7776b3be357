"""Live load and experiments: an origin, the replay against a proxy, the processes of a cell
(onehit, nginx), the experiment file and its run."""
