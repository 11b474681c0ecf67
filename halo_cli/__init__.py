"""The ``halo`` command line."""
