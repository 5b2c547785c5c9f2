"""Configuration: settings, replicas, values and bounds, resolved once into immutable objects."""
