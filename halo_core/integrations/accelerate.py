"""accelerate's part Halo uses: a model marked ``_is_accelerate_prepared`` is left as it is by ``prepare_model``
(neither moved nor wrapped in DDP), which is how a model Halo laid out keeps its own placement and gradient reduction.
Before accelerate 1.14 ``prepare_model`` did not read the mark, and wrapped the laid-out model in DDP."""

from __future__ import annotations

from halo_core.integrations import Seam, check

SEAMS = (Seam("accelerate:Accelerator", "prepare_model", reads="_is_accelerate_prepared"),)

check("accelerate", SEAMS)

#: Set on a model to keep ``Accelerator.prepare_model`` from moving or wrapping it.
PREPARED = "_is_accelerate_prepared"
