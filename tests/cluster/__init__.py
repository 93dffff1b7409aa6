"""Multi-node tests (a package, so that the cluster fixture is torn down with it)."""
