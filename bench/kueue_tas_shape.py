"""Kueue's TAS scheduler-performance configuration, as data: the topology, the nodes, the queues, the nine workload
classes and Kueue's limits. Read by ``kueue_tas_scenario.py`` (the whole pipeline) and ``kueue_tas_engine.py``
(the admission engine alone, in simulated time).

Read from kubernetes-sigs/kueue at commit ff69552e79ad21652c36caa97038382e55625cf7 (2026-08-22):
``test/performance/scheduler/configs/tas/generator.yaml`` (the configuration),
``test/performance/scheduler/configs/tas/rangespec.yaml`` (the limits; thresholds set by kueue#9495, usage
lowered by #12840), ``test/performance/scheduler/runner/generator/generator.go`` and ``topology_generator.go``
(how the runner turns the configuration into objects), ``runner/recorder/recorder.go`` and ``checker/checker_test.go``
(how usage and time to admission are measured).

- Topology ``default-topology``, levels ``cloud.provider.com/topology-block`` (1 block),
  ``cloud.provider.com/topology-rack`` (10 racks per block), ``kubernetes.io/hostname`` (64 nodes per rack): 640
  nodes, each allocatable cpu 96, memory 256Gi, pods 110, Ready, labelled ``tas-node-group: tas``. Label values
  ``block-0``, ``rack-<r>``; node names ``node-b0-r<r>-n<n>``. (Kueue's generator sets ``kubernetes.io/hostname``
  to ``node-<n>``, a value repeated in every rack, unique only beside its rack; here it is the node's name, as a
  kubelet sets it: the same 640 hosts and 10 racks.)
- ResourceFlavor ``tas-flavor``: node labels ``tas-node-group: tas``, ``topologyName: default-topology``.
- 5 cohorts x 6 ClusterQueues, each with cpu on ``tas-flavor``: nominalQuota 20, borrowingLimit 100; preemption
  reclaimWithinCohort Any, withinClusterQueue LowerPriority. Only cpu is covered in Kueue's (and in the engine
  replay); the pipeline's platform covers memory too, with a quota no run reaches (every taugrid pod requests
  memory; 1Mi here).
- Per ClusterQueue, nine workload sets created concurrently, each on its own cadence (the generator waits one
  interval before each creation, the first included); each workload one pod set ``main`` of ``podCount`` pods of
  ``request`` cpu, finished ``runtimeMs`` after admission (the runner mimics the job):

  ========================  =====  ===========  =======  ========  =======  ====  =========================
  class                     count  interval ms  runtime  priority  request  pods  topology request (rack)
  ========================  =====  ===========  =======  ========  =======  ====  =========================
  small-required-rack         120          100      200        50     500m     2  required
  small-preferred-rack        120          100      200        50     500m     2  preferred
  small-balanced-rack         110          100      200        50     500m     2  slice-required, slice 1
  medium-required-rack         34          500      500       100    1250m     4  required
  medium-preferred-rack        33          500      500       100    1250m     4  preferred
  medium-balanced-rack         33          500      500       100    1250m     4  slice-required, slice 2
  large-required-rack          17         1200     1000       200    2500m     8  required
  large-preferred-rack         17         1200     1000       200    2500m     8  preferred
  large-balanced-rack          16         1200     1000       200    2500m     8  slice-required, slice 4
  ========================  =====  ===========  =======  ========  =======  ====  =========================

  = 500 per ClusterQueue, 15,000 in all (1, 5 and 20 cpu per small, medium and large workload, as Kueue's
  baseline). Arrivals: about 1,155 a second across the 30 queues for the first 12 s.
- Limits (rangespec): wall (the runner's command) <= 482 s; usage of the ClusterQueue class ``cq`` >= 57 % (the
  queues' admitted cpu integrated over time, divided by their nominal quota times the monitored time); mean time
  to admission (creation to the Admitted condition) per class, ms: large-balanced 46,000, large-preferred 48,000,
  large-required 48,000, medium-balanced 128,000, medium-preferred 128,000, medium-required 129,000,
  small-balanced 286,000, small-preferred 296,000, small-required 297,000.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_LABEL = "cloud.provider.com/topology-block"
RACK_LABEL = "cloud.provider.com/topology-rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
TOPOLOGY = "default-topology"
FLAVOR = "tas-flavor"
NODE_GROUP = ("tas-node-group", "tas")
BLOCKS, RACKS, NODES_PER_RACK = 1, 10, 64
NODE_CPU, NODE_MEMORY_GI = 96, 256
COHORTS, CQS = 5, 6
NOMINAL_CPU, BORROWING_LIMIT_CPU = 20, 100
WALL_LIMIT_S, USAGE_LIMIT_PCT = 482.0, 57.0


@dataclass(frozen=True)
class TasClass:
    name: str
    count: int  # per ClusterQueue
    every: float  # seconds between creations
    seconds: float  # runtime
    priority: int
    cpu: float  # per pod
    pods: int
    constraint: str  # required | preferred | balanced
    slice_size: int  # balanced only
    limit_s: float  # Kueue's mean time to admission limit

    @property
    def units(self) -> float:
        """cpu the whole workload holds."""
        return self.cpu * self.pods

    @property
    def priority_class(self) -> str:
        return f"p{self.priority}"


CLASSES = (
    TasClass("small-required-rack", 120, 0.1, 0.2, 50, 0.5, 2, "required", 0, 297.0),
    TasClass("small-preferred-rack", 120, 0.1, 0.2, 50, 0.5, 2, "preferred", 0, 296.0),
    TasClass("small-balanced-rack", 110, 0.1, 0.2, 50, 0.5, 2, "balanced", 1, 286.0),
    TasClass("medium-required-rack", 34, 0.5, 0.5, 100, 1.25, 4, "required", 0, 129.0),
    TasClass("medium-preferred-rack", 33, 0.5, 0.5, 100, 1.25, 4, "preferred", 0, 128.0),
    TasClass("medium-balanced-rack", 33, 0.5, 0.5, 100, 1.25, 4, "balanced", 2, 128.0),
    TasClass("large-required-rack", 17, 1.2, 1.0, 200, 2.5, 8, "required", 0, 48.0),
    TasClass("large-preferred-rack", 17, 1.2, 1.0, 200, 2.5, 8, "preferred", 0, 48.0),
    TasClass("large-balanced-rack", 16, 1.2, 1.0, 200, 2.5, 8, "balanced", 4, 46.0),
)
BY_NAME = {c.name: c for c in CLASSES}


@dataclass(frozen=True)
class PoolNode:
    name: str
    block: str
    rack: str


def nodes() -> list[PoolNode]:
    """The 640 nodes, in the generator's order (block, then rack, then node)."""
    return [PoolNode(f"node-b{b}-r{r}-n{n}", f"block-{b}", f"rack-{r}")
            for b in range(BLOCKS) for r in range(RACKS) for n in range(NODES_PER_RACK)]


def count(cls: TasClass, fraction: float) -> int:
    """Workloads of a class per ClusterQueue at ``fraction`` of Kueue's counts (at least one)."""
    return max(1, int(cls.count * fraction))


def nominal_cpu() -> float:
    return float(NOMINAL_CPU * COHORTS * CQS)


def queue_names() -> list[tuple[str, str]]:
    """(cohort, ClusterQueue) for every queue, ``cq-<cohort>-<i>``."""
    return [(f"cohort-{c}", f"cq-{c}-{q}") for c in range(COHORTS) for q in range(CQS)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
