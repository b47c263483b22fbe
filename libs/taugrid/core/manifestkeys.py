"""Names the renderer writes into manifests and a backend reads back from them: Kueue's pod-set topology
annotations and the source-fetch init container's names.

They live here, below both, so the local cluster reads them without importing the renderer's package (its
manifest schema validator, jsonschema and kubernetes_validate, and the run config models: about 4 MB resident
in a process that never renders; ``tests/contract/test_import_weight.py``). ``taugrid.render.common`` and
``taugrid.render.source`` re-export them under the same names.
"""

from __future__ import annotations

TOPOLOGY_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
TOPOLOGY_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
TOPOLOGY_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
TOPOLOGY_SLICE = "kueue.x-k8s.io/podset-slice-required-topology"
TOPOLOGY_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
TOPOLOGY_GROUP = "kueue.x-k8s.io/podset-group-name"

SOURCE_VOLUME = "tau-source"  # the emptyDir the fetch container unpacks the run's source snapshot into
FETCH_CONTAINER = "tau-source-fetch"  # that init container
SOURCE_DIGEST_ANNOTATION = "taugrid.io/source-digest"  # the snapshot's digest, on the pod template
