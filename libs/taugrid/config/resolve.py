"""Policy resolution: a validated ``tau.yaml`` plus the platform → one ``ResolvedRun``, or every reason
it is refused.

Precedence (reference ``taugrid.md`` §2.6): the platform wins and fails closed. The workspace fixes namespace,
queue, output root and caps; the run may ask only for what the workspace allows (image, profile, GPUs,
retries, deadline, priority); resources come from explicit ``compute.*`` requests, else the profile, else 1
CPU / 1Gi / no GPU.

Invariants: ``resolve_run`` is pure (no I/O, no clock); the same inputs give the same ``ResolvedRun``; on
rejection it raises one ``ConfigError`` carrying every issue, each naming the field a person must change.
TAU_* variables are not added here — the backend sets them per attempt.
"""

from __future__ import annotations

import fnmatch
import json
import math
import posixpath

from taugrid.config.departments import KAI_QUEUE_LABEL
from taugrid.config.elastic import elastic_bounds
from taugrid.config.gpuvendor import choose_vendor
from taugrid.config.keyrules import GPU_CLASS_LABEL, topology_fit, topology_level
from taugrid.config.launch import ELASTIC_TORCHRUN_ENV, build_command
from taugrid.config.platform import GPU_RESOURCE, ComputeProfile, Platform, Workspace
from taugrid.config.platformtopology import queue_topologies
from taugrid.config.source import make_issue, raise_issues
from taugrid.config.taujob import TauConfig
from taugrid.config.taurules import check_rules, entrypoint_escape
from taugrid.core.contracts import Issue, Resilience, ResolvedRun, Resources, checkpoints_of
from taugrid.core.devices import GPU_RESOURCES
from taugrid.core.events import HIGH_LANE
from taugrid.core.ids import is_run_id
from taugrid.core.quantity import format_cpu, format_memory, parse_cpu, parse_memory

DEFAULT_TTL_S = 28800
_MiB = 1 << 20


class _Issues:
    def __init__(self, cfg: TauConfig) -> None:
        self.cfg = cfg
        self.items: list[dict[str, object]] = []

    def add(self, path: tuple[str | int, ...], message: str, fix: str = "") -> None:
        self.items.append(make_issue(path, message, fix, file=self.cfg.source_path, lines=self.cfg._lines))


def namespace_workspaces(platform: Platform, namespace: str | None) -> list[str]:
    """The workspaces that run in ``namespace``, by name."""
    return sorted(w.name for w in platform.workspaces if namespace and w.namespace == namespace)


def namespace_workspace(cfg: TauConfig, platform: Platform) -> str | None:
    """The workspace a config means when it names only ``policy.namespace`` (TauGrid's configs often do): the
    one workspace in that namespace, or None (none, or several: then ``resolve_run`` asks for the name)."""
    found = namespace_workspaces(platform, cfg.policy.namespace)
    return found[0] if len(found) == 1 else None


def resolve_run(
    cfg: TauConfig,
    platform: Platform,
    *,
    run_id: str,
    submission_id: str,
    workspace: str | None,
    platform_revision: int,
    config_hash: str,
    source_object: str = "",
    source_digest: str = "",
    user: str = "",
    project_subdir: str = "",
) -> ResolvedRun:
    """``project_subdir``: the config's folder inside the shipped project ("" when the project is that folder;
    the client ships a parent when a managed manifest names a script beside its folder)."""
    issues = _Issues(cfg)
    issues.items.extend(check_rules(cfg))  # a config built without load_tau_config gets the same checks
    if not cfg.name or not cfg.entrypoint or not cfg.engine:
        raise_issues(issues.items)
    ws_name = workspace or cfg.policy.workspace or namespace_workspace(cfg, platform) or "default"
    by_namespace = namespace_workspaces(platform, cfg.policy.namespace)
    if not workspace and not cfg.policy.workspace and len(by_namespace) > 1:
        issues.add(("policy", "namespace"),
                   f"namespace {cfg.policy.namespace!r} holds workspaces {', '.join(by_namespace)}",
                   "set policy.workspace to the one this run belongs to")
        raise_issues(issues.items)
    ws = platform.workspace(ws_name)
    if ws is None:
        known = ", ".join(sorted(w.name for w in platform.workspaces)) or "(none defined)"
        message, fix = f"unknown workspace {ws_name!r}; known workspaces: {known}", "use one of them"
        if workspace:  # chosen on the command line, so no line in the file to point at
            issues.items.append(make_issue("policy.workspace", message, fix, file=cfg.source_path, lines={}))
        else:
            issues.add(
                ("policy", "workspace"), message, "set policy.workspace (or --workspace) to one of them"
            )
        raise_issues(issues.items)
        raise AssertionError("unreachable")
    assert cfg.name and cfg.entrypoint and cfg.engine  # checked above
    if cfg.policy.namespace and cfg.policy.namespace != ws.namespace:
        issues.add(
            ("policy", "namespace"),
            f"workspace {ws.name!r} runs in namespace {ws.namespace!r}, not {cfg.policy.namespace!r}",
            "remove policy.namespace (the workspace decides it), or name the workspace of that namespace",
        )
    profile = _profile(cfg, platform, ws, issues)
    image = _image(cfg, ws, issues, profile)
    requests, limits, pods = _resources(cfg, profile, issues)
    local_queue, cluster_queue = _queue(cfg, platform, ws, issues)
    gpu_resource = _gpu_resource(cfg, platform, profile, requests, cluster_queue, issues)
    _capacity(cfg, platform, ws, profile, requests, pods, cluster_queue, issues, gpu_resource)
    priority_class, priority, preemptible = _priority(cfg, platform, ws, issues)
    node_selector = _node_selector(cfg, profile, issues)
    output_dir = _output_dir(cfg, ws, run_id, issues)
    checkpoint_dir = checkpoints_of(output_dir)  # ResolvedRun derives it so when stored JSON leaves it out
    r = cfg.resilience
    checkpoint_path = (
        _inside_workspace(r.checkpoint_path, ws, run_id, ("resilience", "checkpoint_path"), issues)
        if r.checkpoint_path else checkpoint_dir
    )
    env = dict(cfg.runtime.env)
    if "TAU_RESUME_FROM" in env:  # a variable the config may set, checked as `tau run resume`'s point is
        env["TAU_RESUME_FROM"], problem = resume_point(env["TAU_RESUME_FROM"], ws,
                                                       field="runtime.env.TAU_RESUME_FROM")
        if problem is not None:
            issues.add(("runtime", "env", "TAU_RESUME_FROM"), problem.message, problem.fix)
    if ws.max_retries is not None and r.max_retries > ws.max_retries:
        issues.add(
            ("resilience", "max_retries"),
            f"{r.max_retries} exceeds the cap of {ws.max_retries} in workspace {ws.name!r}",
            f"set resilience.max_retries to {ws.max_retries} or fewer",
        )
    deadline = _deadline(cfg, ws, issues)
    head = _head(cfg)
    working_dir = _working_dir(cfg, project_subdir, issues)
    launcher, command, nproc = build_command(cfg, requests.gpu, issues.add)
    topology_fit(cfg, queue_topologies(platform, cluster_queue), cfg.execution.nodes if cfg.engine == "job" else pods,
                 issues.add, queue=cluster_queue)
    raise_issues(issues.items)
    elastic_min, elastic_max, elastic_step, elastic_cooldown_s = _elastic_fields(cfg)
    return ResolvedRun(
        run_id=run_id,
        submission_id=submission_id,
        workspace=ws.name,
        namespace=ws.namespace,
        name=cfg.name,
        engine=cfg.engine,
        launcher=launcher,
        entrypoint=cfg.entrypoint,
        args=list(cfg.args),
        command=command,
        image=image,
        env=env,
        env_secret=dict(cfg.runtime.env_secret),
        working_dir=working_dir,
        local_queue=local_queue,
        cluster_queue=cluster_queue,
        priority_class=priority_class,
        priority=priority,
        preemptible=preemptible,
        profile=profile.name if profile else "",
        resources=requests,
        limits=limits,
        nodes=cfg.execution.nodes if cfg.engine == "job" else 1,
        elastic_min=elastic_min,
        elastic_max=elastic_max,
        elastic_step=elastic_step,
        elastic_cooldown_s=elastic_cooldown_s,
        processes_per_node=nproc,
        workers=pods if cfg.engine == "ray" else 0,
        gpus_per_worker=requests.gpu if cfg.engine == "ray" else 0,
        pip=list(cfg.runtime.pip),
        resilience=Resilience(
            max_retries=r.max_retries,
            retry_on=list(r.retry_on),
            backoff_initial_s=r.backoff_initial,
            backoff_max_s=r.backoff_max,
            checkpoint_path=checkpoint_path,
            hang_timeout_s=r.hang_timeout,
        ),
        output_dir=output_dir,
        checkpoint_dir=checkpoint_dir,
        source_object=source_object,
        source_digest=source_digest,
        source_image=cfg.run.source.image if cfg.run.source else "",
        source_path=cfg.run.source.path if cfg.run.source else "",
        config_hash=config_hash,
        platform_revision=platform_revision,
        active_deadline_s=deadline,
        ttl_seconds_after_finished=cfg.run.ttl_seconds_after_finished
        or ws.ttl_seconds_after_finished
        or DEFAULT_TTL_S,
        security_restricted=cfg.runtime.security.mode == "restricted",
        node_selector=node_selector,
        tolerations=[t.model_dump(exclude_defaults=False) for t in profile.tolerations] if profile else [],
        placement=cfg.compute.placement or "binpack",
        gang=True if cfg.compute.gang is None else cfg.compute.gang,
        data_pvc=cfg.storage.data_pvc or cfg.storage.result_pvc or "",
        experiment={k: v for k, v in cfg.experiment.model_dump().items() if isinstance(v, str) and v},
        head_resources=head[0],
        head_limits=head[1],
        mounts=_mounts(cfg),
        image_assets=[a.model_dump() for a in cfg.storage.image_assets],
        pod_priority_class=cfg.policy.pod_priority_class or "",
        run_as_user=cfg.runtime.security.run_as_user,
        run_as_group=cfg.runtime.security.run_as_group,
        gpu_resource="" if gpu_resource == GPU_RESOURCE else gpu_resource,
        topology_level=(topology_level(cfg.policy.topology) or "") if cfg.policy.topology else "",
        topology_required=cfg.policy.topology_policy != "preferred",
        topology_unconstrained=cfg.policy.topology_policy == "unconstrained",
        topology_slice_level=(topology_level(cfg.policy.topology_slice.level) or "")
        if cfg.policy.topology_slice else "",
        topology_slice_size=cfg.policy.topology_slice.size if cfg.policy.topology_slice else 0,
        devices=dict(cfg.runtime.devices),
        shm_size=parse_memory(cfg.runtime.shm_size) if cfg.runtime.shm_size else 0,
        labels={**{f"taugrid.io/{k}": v for k, v in (("team", cfg.policy.team), ("lane", cfg.policy.lane)) if v},
                # a KAI project's runs name their leaf queue, as KAI's scheduler and KubeRay's KAI plugin read it
                **({KAI_QUEUE_LABEL: cluster_queue} if platform.project_limits(cluster_queue) is not None else {})},
        platform_env=_platform_env(cfg, checkpoint_dir),
    )


def _image(cfg: TauConfig, ws: Workspace, issues: _Issues, profile: ComputeProfile | None) -> str:
    image = cfg.runtime.image or ""
    # point at the spelling that won: runtime.image, then run.image, then the top-level alias
    written = [p for p in (("runtime", "image"), ("run", "image"), ("image",)) if cfg.written(*p)]
    field: tuple[str, ...] = written[0] if written else ("runtime", "image")
    if not image and cfg.run.source is None and profile is not None and profile.image:
        image, field = profile.image, ("policy", "profile")  # the profile's vendor stack (a ROCm, a Gaudi image)
    if cfg.run.source is not None:
        # A source-image job runs in its source image: the code is already there.
        if image and image != cfg.run.source.image:
            issues.add(
                field,
                f"a source-image job runs in run.source.image ({cfg.run.source.image!r}), not {image!r}",
                "remove the image key, or set it to the same image as run.source.image",
            )
        image, field = cfg.run.source.image, ("run", "source", "image")
    patterns = ws.allowed_images
    if image and patterns and not any(fnmatch.fnmatchcase(image, p) for p in patterns):
        issues.add(
            field,
            f"image {image!r} is not allowed in workspace {ws.name!r}",
            f"use an image matching one of: {', '.join(patterns)}",
        )
    if not image and patterns and not ws.allow_local_process:
        issues.add(
            ("runtime", "image"),
            f"workspace {ws.name!r} requires a container image",
            f"set runtime.image to an image matching one of: {', '.join(patterns)}",
        )
    return image


def _profile(cfg: TauConfig, platform: Platform, ws: Workspace, issues: _Issues) -> ComputeProfile | None:
    name = cfg.policy.profile or ws.default_profile
    if not name:
        return None
    field = ("policy", "profile")
    allowed = ws.allowed_profiles or [p.name for p in platform.compute_profiles]
    profile = platform.profile(name)
    if profile is None:
        issues.add(field, f"unknown compute profile {name!r}", f"use one of: {', '.join(allowed)}")
    elif ws.allowed_profiles and name not in ws.allowed_profiles:
        issues.add(
            field,
            f"profile {name!r} is not allowed in workspace {ws.name!r}",
            f"use one of: {', '.join(allowed)}",
        )
        return None
    return profile


def _resources(
    cfg: TauConfig, profile: ComputeProfile | None, issues: _Issues
) -> tuple[Resources, Resources | None, int]:
    """Per-pod requests and limits, and the pod count (nodes for a Job, workers for Ray)."""
    c, ray = cfg.compute, cfg.engine == "ray"
    cpu_req, mem_req = (
        (c.worker_cpu_request, c.worker_memory_request) if ray else (c.cpu_request, c.memory_request)
    )
    cpu_lim, mem_lim = (c.worker_cpu_limit, c.worker_memory_limit) if ray else (c.cpu_limit, c.memory_limit)
    cpu = parse_cpu(cpu_req) if cpu_req is not None else parse_cpu(profile.cpu) if profile else 1.0
    memory = (
        parse_memory(mem_req) if mem_req is not None else parse_memory(profile.memory) if profile else 1 << 30
    )
    explicit_gpu = (
        (c.gpus_per_worker if ray else c.gpus) is not None
        or c.gpu_fraction is not None
        or c.gpu_memory is not None
    )
    if explicit_gpu:
        gpu = (c.gpus_per_worker if ray else c.gpus) or 0
        fraction, gpu_memory = c.gpu_fraction or 0.0, c.gpu_memory
    elif profile is not None:
        gpu, fraction, gpu_memory = profile.gpu, profile.gpu_fraction or 0.0, profile.gpu_memory
    else:
        gpu, fraction, gpu_memory = 0, 0.0, None
    memory_mb = parse_memory(gpu_memory) // _MiB if gpu_memory else 0
    shared = fraction > 0 or memory_mb > 0
    if (
        shared
        and not explicit_gpu
        and (ray or cfg.execution.nodes > 1 or cfg.execution.launcher == "torchrun")
    ):
        issues.add(
            ("policy", "profile"),
            f"profile {profile.name if profile else ''!r} shares one GPU; distributed runs need whole GPUs",
            "pick a whole-GPU profile or set compute.gpus",
        )
    requests = Resources(cpu=cpu, memory=memory, gpu=gpu, gpu_fraction=fraction, gpu_memory_mb=memory_mb)
    limits = None
    if cpu_lim is not None or mem_lim is not None:
        lcpu = parse_cpu(cpu_lim) if cpu_lim is not None else cpu
        lmem = parse_memory(mem_lim) if mem_lim is not None else memory
        prefix = "worker_" if ray else ""
        if lcpu < cpu:
            issues.add(
                ("compute", f"{prefix}cpu_limit"),
                f"limit {format_cpu(lcpu)} is below the request {format_cpu(cpu)}",
                "raise the limit or lower the request",
            )
        if lmem < memory:
            issues.add(
                ("compute", f"{prefix}memory_limit"),
                f"limit {format_memory(lmem)} is below the request {format_memory(memory)}",
                "raise the limit or lower the request",
            )
        limits = Resources(cpu=lcpu, memory=lmem, gpu=gpu, gpu_fraction=fraction, gpu_memory_mb=memory_mb)
    pods = (c.workers or 1) if ray else cfg.execution.nodes
    return requests, limits, pods


def _queue(cfg: TauConfig, platform: Platform, ws: Workspace, issues: _Issues) -> tuple[str, str]:
    name = cfg.policy.queue
    if not name or name == "auto":
        name = ws.local_queue
    lq = platform.local_queue(name, ws.namespace)
    if lq is None:
        known = [q.name for q in platform.local_queues if q.namespace == ws.namespace]
        issues.add(
            ("policy", "queue"),
            f"no local queue {name!r} in workspace {ws.name!r} (namespace {ws.namespace!r})",
            f"use one of: {', '.join(known)}, or 'auto'",
        )
        return name, ""
    return lq.name, lq.cluster_queue


def _capacity(
    cfg: TauConfig,
    platform: Platform,
    ws: Workspace,
    profile: ComputeProfile | None,
    req: Resources,
    pods: int,
    cluster_queue: str,
    issues: _Issues,
    gpu_resource: str = GPU_RESOURCE,
) -> None:
    """Refuse what can never run: over the workspace GPU cap, or over a queue that cannot borrow."""
    ray = cfg.engine == "ray"
    gpu_keys = ("gpus_per_worker" if ray else "gpus", "gpu_fraction", "gpu_memory")
    gpu_field = next(
        (("compute", k) for k in gpu_keys if cfg.written("compute", k)),
        ("policy", "profile") if profile else ("compute", gpu_keys[0]),
    )
    shared = req.gpu_fraction > 0 or req.gpu_memory_mb > 0
    total_gpus = req.gpu * pods + (1 if shared and req.gpu == 0 else 0)
    if ws.max_gpus_per_run is not None and total_gpus > ws.max_gpus_per_run:
        issues.add(
            gpu_field,
            f"asks for {total_gpus} GPU(s); workspace {ws.name!r} allows at most "
            f"{ws.max_gpus_per_run} per run",
            "ask for fewer GPUs, or ask the platform team to raise the cap",
        )
    cq = platform.cluster_queue(cluster_queue)
    if cq is None:
        return
    # a queue in a cohort may borrow, at most everything its cohort tree holds; admission decides the rest
    root = platform.cohort_root(cq.cohort)
    # the queue and every written queue of its cohort tree (a project's queue is not written: its limits bound it)
    pool = platform.cohort_tree_queues(root) if root else [q for q in platform.cluster_queues if q is cq]
    # MIG slices and extra devices are resources of their own: a queue without quota for them never admits
    if cfg.compute.mig_profile:
        gpu_field = ("compute", "mig_profile")
    elif cfg.written("compute", "gpu_vendor") and gpu_resource != GPU_RESOURCE:
        gpu_field = ("compute", "gpu_vendor")  # another vendor's GPUs are a resource of their own, as MIG slices are
    need = {"cpu": req.cpu * pods, "memory": float(req.memory * pods), gpu_resource: float(total_gpus)}
    need.update({name: float(count * pods) for name, count in cfg.runtime.devices.items()})
    prefix = "worker_" if ray else ""
    fields: dict[str, tuple[str, ...]] = {gpu_resource: gpu_field}
    fields.update({name: ("runtime", "devices", name) for name in cfg.runtime.devices})
    for resource in ("cpu", "memory"):
        key = f"{prefix}{resource}_request"
        fields[resource] = (
            ("compute", key) if cfg.written("compute", key) or not profile else ("policy", "profile")
        )
    caps = platform.project_limits(cq.name)  # a KAI project: only its limits bound it (idle GPUs are shared)
    for resource, amount in need.items():
        have = (caps.get(resource) if caps is not None else platform.cohort_tree_nominal(root, resource) if root
                else sum(q.nominal(resource) for q in pool))
        if have is not None and amount > have:
            shown = (
                (format_cpu(amount), format_cpu(have))
                if resource == "cpu"
                else (format_memory(int(amount)), format_memory(int(have)))
                if resource == "memory"
                else (f"{amount:g}", f"{have:g}")
            )
            where = (f"cluster queue {cq.name!r}" + (f" and its cohort {root!r}" if root else "") if caps is None
                     else f"project {cq.name!r} (department {cq.cohort!r}) has a limit and")
            issues.add(
                fields[resource],
                f"asks for {shown[0]} {resource} in total; {where} can never hold more "
                f"than {shown[1]}, so the run would never start",
                "ask for less" if have or resource not in GPU_RESOURCES
                else "ask for a GPU vendor the queue has quota for (compute.gpu_vendor: any takes whichever it has)",
            )


def _gpu_resource(cfg: TauConfig, platform: Platform, profile: ComputeProfile | None, req: Resources,
                  cluster_queue: str, issues: _Issues) -> str:
    """The extended resource the run's GPUs are asked as: a MIG slice, else its vendor's (``gpuvendor``)."""
    shared = req.gpu_fraction > 0 or req.gpu_memory_mb > 0
    vendor = choose_vendor(cfg, platform, profile, cluster_queue, wants_gpu=req.gpu > 0 or shared, shared=shared,
                           add=issues.add)
    return f"nvidia.com/mig-{cfg.compute.mig_profile}" if cfg.compute.mig_profile else vendor.resource


def _requested_priority(cfg: TauConfig, ws: Workspace) -> tuple[tuple[str, ...], str | None]:
    """(the field that names it, the priority class name) the run asks for, the workspace's default filling in."""
    p = cfg.policy
    choices = [
        (("policy", "workload_priority_class"), p.workload_priority_class),
        (("policy", "priority_tier"), p.priority_tier),
        (("policy", "priority"), p.priority),
    ]
    field, name = next(
        ((f, n) for f, n in choices if n and n != "default"), (("policy", "priority_tier"), None)
    )
    if not p.disable_default_priorities:  # TauGrid: the run gets no default class, only what it names
        name = name or ws.default_priority
    return field, name


def lane_for(cfg: TauConfig, platform: Platform, workspace: str) -> str:
    """The priority lane (``events.HIGH_LANE`` or "") a run of ``cfg`` takes before the policy decides its real
    priority: high only for a class the workspace allows that outranks its default (``Platform.high_lane``)."""
    ws = platform.workspace(workspace)
    if ws is None:
        return ""
    _, name = _requested_priority(cfg, ws)
    return HIGH_LANE if name and platform.high_lane(ws.name, name) else ""


def _priority(cfg: TauConfig, platform: Platform, ws: Workspace, issues: _Issues) -> tuple[str, int, bool]:
    p = cfg.policy
    field, name = _requested_priority(cfg, ws)
    if not name:
        return "", 0, p.preemptible is not False
    pc = platform.priority_class(name)
    if pc is None:
        known = ", ".join(
            f"{c.name} ({c.value})" for c in sorted(platform.priority_classes, key=lambda c: c.value)
        )
        issues.add(field, f"unknown priority class {name!r}", f"use one of: {known}")
        return name, 0, True
    if not platform.allows_priority(ws.name, pc.name):
        allowed = ", ".join(ws.allowed_priority_classes)
        issues.add(field, f"priority class {pc.name!r} is not allowed in workspace {ws.name!r}",
                   f"use one of the workspace's allowed_priority_classes: {allowed}")
    if p.preemptible is False and pc.preemptible:
        fixed = [c.name for c in platform.priority_classes if not c.preemptible]
        issues.add(
            ("policy", "preemptible"),
            f"priority class {pc.name!r} is preemptible",
            f"set policy.workload_priority_class to one of: {', '.join(fixed)}"
            if fixed
            else "this platform has no non-preemptible priority class; remove policy.preemptible",
        )
    preemptible = pc.preemptible or p.preemptible is True
    return pc.name, pc.value, preemptible


def _node_selector(cfg: TauConfig, profile: ComputeProfile | None, issues: _Issues) -> dict[str, str]:
    merged = dict(cfg.policy.node_selector)
    gpu_class = cfg.policy.gpu_class
    if gpu_class and gpu_class != "any":
        if merged.get(GPU_CLASS_LABEL, gpu_class) != gpu_class:
            issues.add(("policy", "gpu_class"), f"conflicts with policy.node_selector {GPU_CLASS_LABEL}",
                       "set the GPU class in one place")
        merged[GPU_CLASS_LABEL] = gpu_class
    # policy.clear_node_selector (a Job): the run's own selector only, none of the profile's
    inherited = {} if cfg.policy.clear_node_selector else (profile.node_selector if profile else {})
    for key, value in inherited.items():
        if key in merged and merged[key] != value:
            issues.add(
                ("policy", "node_selector", key),
                f"profile {profile.name!r} pins {key}={value}",  # type: ignore[union-attr]
                "remove the key; the profile decides placement",
            )
        merged[key] = value
    return merged


def _working_dir(cfg: TauConfig, subdir: str, issues: _Issues) -> str:
    """The run's working directory: the engine's key, inside the config's folder of the shipped project."""
    wd = (cfg.runtime.working_dir if cfg.engine == "job" else cfg.run.working_dir) or ""
    sub = posixpath.normpath(subdir) if subdir else ""
    if sub in ("", "."):
        sub = ""
    if sub.startswith(("/", "..")) or "\\" in sub:
        issues.add(("entrypoint",), f"the config's folder {subdir!r} is not inside the shipped project",
                   "submit with tau run, which ships the folder holding tau.yaml")
        return wd
    depth = entrypoint_escape(cfg)
    if depth > (len(sub.split("/")) if sub else 0):
        issues.add(("entrypoint",), f"{cfg.entrypoint!r} is outside the project snapshot",
                   "copy the script into the project folder and name it relatively")
    if not sub or (wd.startswith("/") and cfg.engine == "job"):
        return wd
    return posixpath.normpath(posixpath.join(sub, wd)) if wd else sub


def _head(cfg: TauConfig) -> tuple[Resources | None, Resources | None]:
    """A Ray head's requests and limits from compute.head_* (None: the renderer's default head)."""
    c = cfg.compute
    if cfg.engine != "ray" or all(
        v is None for v in (c.head_cpu_request, c.head_memory_request, c.head_cpu_limit, c.head_memory_limit)
    ):
        return None, None
    cpu = parse_cpu(c.head_cpu_request) if c.head_cpu_request is not None else 1.0
    memory = parse_memory(c.head_memory_request) if c.head_memory_request is not None else 4 << 30
    requests = Resources(cpu=cpu, memory=memory)
    if c.head_cpu_limit is None and c.head_memory_limit is None:
        return requests, None
    return requests, Resources(
        cpu=parse_cpu(c.head_cpu_limit) if c.head_cpu_limit is not None else 0.0,
        memory=parse_memory(c.head_memory_limit) if c.head_memory_limit is not None else 0,
    )


def _mounts(cfg: TauConfig) -> list[dict[str, object]]:
    s = cfg.storage
    out: list[dict[str, object]] = [
        {"name": claim, "claim": claim, "path": f"/mnt/{claim}", "read_only": False, "sub_path": ""}
        for claim in s.volumes
    ]
    out += [{"name": m.name, "claim": m.pvc, "path": m.mount_path, "read_only": m.read_only,
             "sub_path": m.sub_path or ""} for m in s.mounts]
    return out


def _platform_env(cfg: TauConfig, checkpoint_dir: str) -> dict[str, str]:
    """What the config tells the script through the platform's variables (TauGrid's names where it has them)."""
    ex, env = cfg.execution, {}
    if cfg.engine == "ray" and ex.launcher == "ray-tune":
        env["TAU_TUNE_METRIC"] = ex.metric or ""
        env["TAU_TUNE_MODE"] = ex.mode or "min"
        env["TAU_TUNE_NUM_SAMPLES"] = str(ex.num_samples or 1)
        if ex.max_concurrent_trials is not None:
            env["TAU_TUNE_MAX_CONCURRENT_TRIALS"] = str(ex.max_concurrent_trials)
        env["TAU_TUNE_PARAM_SPACE"] = json.dumps(ex.configs, sort_keys=True)
    elif cfg.engine == "ray" and ex.configs:
        env["TAU_RAY_TRAIN_CONFIG_JSON"] = json.dumps(ex.configs, sort_keys=True)
    if cfg.storage.checkpoint:
        env["TAU_CHECKPOINT_ARTIFACT"] = posixpath.join(checkpoint_dir, cfg.storage.checkpoint)
    if cfg.engine != "ray" and ex.launcher == "torchrun" and elastic_bounds(cfg) is not None:
        env.update(ELASTIC_TORCHRUN_ENV)
    if cfg.metrics.history:
        env["TAU_METRICS_HISTORY"] = json.dumps(list(cfg.metrics.history))
    return env


def _output_dir(cfg: TauConfig, ws: Workspace, run_id: str, issues: _Issues) -> str:
    root = ws.output_root.rstrip("/") or "/"
    wanted = cfg.storage.output
    if not wanted:
        return f"{root}/{ws.name}/{run_id}"
    return _inside_workspace(wanted, ws, run_id, ("storage", "output"), issues)


TAUGRID_DATA = "/data"  # TauGrid's runs see their storage here; taugrid reads it as the workspace's own


def _inside_workspace(wanted: str, ws: Workspace, run_id: str, field: tuple[str, ...], issues: _Issues) -> str:
    """``wanted`` normalised, when it lies strictly inside ``<output root>/<workspace>/`` and not inside another
    run's directory; else an issue naming ``field`` (a path elsewhere under the root could be another
    workspace's, or nobody's to write).

    TauGrid's configs name their storage as ``/data/<path>`` (``/data/checkpoints/ray-train``): such a path
    outside the output root is read inside the workspace's own directory, ``<output root>/<workspace>/<path>``,
    so it can never reach another workspace; one under the output root is taken as written (and refused when it
    is not the workspace's)."""
    root = ws.output_root.rstrip("/") or "/"
    base = posixpath.join(root, ws.name)
    normal = posixpath.normpath(wanted) if wanted.startswith("/") else ""
    normal = "/" + normal.lstrip("/") if normal else ""  # POSIX keeps a leading '//'; one root is meant
    if normal.startswith(TAUGRID_DATA + "/") and not _under(normal, root):
        normal = posixpath.join(base, normal.removeprefix(TAUGRID_DATA + "/"))
    if not normal or not normal.startswith(base + "/"):
        issues.add(
            field,
            f"{wanted!r} is outside {base}/, the output directory of workspace {ws.name!r}",
            f"use an absolute path under {base}/ (e.g. {base}/<name>), or {TAUGRID_DATA}/<name> (read as "
            f"{base}/<name>), or remove {'.'.join(field)}",
        )
        return wanted.rstrip("/")
    # Every run's default output directory is `<base>/<run id>`: a path in another run's would overwrite its
    # outputs, so top-level directory names shaped like run ids belong to those runs.
    first = normal.removeprefix(base + "/").split("/", 1)[0]
    if is_run_id(first) and first != run_id:
        issues.add(
            field,
            f"{wanted!r} is inside the output directory of run {first!r}",
            f"name a directory of your own under {base}/ (e.g. {base}/<name>), not another run's",
        )
    return normal


def resume_point(wanted: str, ws: Workspace, *, field: str = "resume_from") -> tuple[str, Issue | None]:
    """The resume point a run of ``ws`` is given for ``wanted`` (``tau run resume``'s checkpoint,
    ``SubmitRequested.resume_from``, or ``runtime.env.TAU_RESUME_FROM``), and why it may not have it: it must lie
    inside the workspace's output directory (any run's there: resuming reads another run's checkpoints), as
    ``/data/<path>`` reads as there too, and the run is given that reading (given ``/data/<path>`` as written, it
    named the host's ``/data``, which is nobody's workspace). The request's body and the config are the
    submitter's to choose, and the path becomes ``TAU_RESUME_FROM``, which a container engine mounts."""
    root = ws.output_root.rstrip("/") or "/"
    base = posixpath.join(root, ws.name)
    normal = "/" + posixpath.normpath(wanted).lstrip("/") if wanted.startswith("/") else ""
    if normal.startswith(TAUGRID_DATA + "/") and not _under(normal, root):
        normal = posixpath.join(base, normal.removeprefix(TAUGRID_DATA + "/"))
    if normal.startswith(base + "/"):
        return normal, None
    return wanted, Issue(field=field, message=f"{wanted!r} is outside {base}/, the output directory of workspace "
                         f"{ws.name!r}: a run resumes only from its own workspace's checkpoints",
                         fix=f"resume from a checkpoint under {base}/ (`tau run resume RUN` picks the run's own)")


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


def _deadline(cfg: TauConfig, ws: Workspace, issues: _Issues) -> int | None:
    asked, cap = cfg.run.active_deadline, ws.active_deadline
    if asked is not None and cap is not None and asked > cap:
        issues.add(
            ("run", "active_deadline"),
            f"{asked:g}s exceeds the cap of {cap:g}s in workspace {ws.name!r}",
            f"set run.active_deadline to {cap:g} seconds or less",
        )
    chosen = asked if asked is not None else cap
    return math.ceil(chosen) if chosen is not None else None


def _elastic_fields(cfg: TauConfig) -> tuple[int, int, int, float]:
    """``policy.mode: elastic``'s (min, max, step, cooldown) for the renderers and the local backend; zeros (the
    defaults of ``ResolvedRun``) for a fixed run."""
    bounds = elastic_bounds(cfg)
    if bounds is None or cfg.policy.elastic is None:
        return 0, 0, 1, 60.0
    return bounds[0], bounds[1], cfg.policy.elastic.step, cfg.policy.elastic.cooldown
