"""The encoder study's library: everything the workflow's rules call, unit-tested on tiny fixtures."""

__version__ = "0.3.0"
