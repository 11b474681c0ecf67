"""The conformance kit: ``check_family("my-family")`` proves a family plugin correct on CPU.

It checks the declaration against tiny random models of every claimed model type
(degree 1), then every declared split that has an engine against a single-process
reference at world sizes 2 and 4 on gloo (spawned processes, real collectives).
"""

from halo_core.testing.declaration import check_family

__all__ = ["check_family"]
