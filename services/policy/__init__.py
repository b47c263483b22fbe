"""policy: resolves a run against the workspace's platform policy (platform wins, fails closed).

Owns: ``submit.accepted`` → ``policy.approved`` (resolved spec + platform revision) | ``policy.rejected``.
"""
