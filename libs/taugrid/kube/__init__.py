"""Kubernetes backend adapter: ``client`` (ApiClient + error translation), ``apply`` (server-side apply,
delete), ``watch`` (list+watch with resume, relist on 410), ``translate`` (pure: k8s objects → run events).

Invariant: no third-party exception (kubernetes_asyncio, aiohttp) leaves this package; callers see
``taugrid.core.errors`` only. ``translate`` imports no I/O library and is shared with the local backend.
"""
