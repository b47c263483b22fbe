"""renderer: turns resolved runs into Kubernetes objects (Job / Indexed Job + Service / RayJob), validates them
against the real schemas, and applies them through the backend; deletes them on cancel.

Owns: ``policy.approved`` and ``recovery.retrying`` → ``render.applied`` | ``render.failed``;
``cancel.requested`` → backend delete (or ``exec.cancelled`` when nothing was applied yet).
"""
