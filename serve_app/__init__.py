"""vaultvec HTTP side: models, routes, auth, error mapping, the gateway engine and app builder."""

__version__ = "0.1.0"
