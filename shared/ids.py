"""Named domain scalars.

``NewType`` keeps them zero-cost at run time while letting the type checker
tell a server id from a job id.
"""

from typing import NewType

JobId = NewType("JobId", str)
ServerId = NewType("ServerId", str)
GpuType = NewType("GpuType", str)
TenantId = NewType("TenantId", str)
