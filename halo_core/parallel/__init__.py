"""The parallel engine: each step of laying a model out lives in its own module (see ``parallelize``)."""
