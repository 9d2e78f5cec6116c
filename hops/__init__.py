"""Hops command-line entry points and glue that is neither a service nor shared."""
