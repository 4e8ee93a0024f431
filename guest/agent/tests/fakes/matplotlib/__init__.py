"""A stand-in for matplotlib (see ../README.md)."""

native_shows = []           # figure numbers open at each call of the original pyplot.show
