"""A run's source: the project snapshot, from the researcher's folder to the pod, in one package.

``archive`` makes the deterministic, content-addressed ``tar.gz`` of a project (the client); ``snapshots`` puts it
into the bus's object stores and verifies it (``uploads`` → ``sources``, promoted by the submitter, write-once);
``fetch`` is the run pod's init container (``python -m taugrid.sources.fetch``), which re-hashes before
unpacking. How the init container is rendered into a pod stays with rendering (``render/source.py``).
"""
