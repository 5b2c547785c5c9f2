"""The pools (sync and async) and the drivers that carry out the core's decisions."""
