"""What instances of a fleet share through Redis: the admission filter and purges."""
