"""Health probes, pings and discovery queries: the I/O beside statements."""
