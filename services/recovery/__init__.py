"""recovery: diagnoses failed attempts and retries them with backoff (resume from the last checkpoint, the
faulty node excluded) or gives up with the reason. Runs service-side: a closed terminal changes nothing.

Owns: ``exec.failed``, ``render.failed``, ``health.degraded``, ``admission.preempted`` →
``recovery.retrying`` | ``recovery.gave_up``.
"""
