"""The I/O-free core: ordering, error accounting, classification, health and attempt decisions."""
