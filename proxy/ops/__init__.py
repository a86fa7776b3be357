"""The running service: its listeners, its workers and the memory they share, its admin port."""
