from taugrid.local.rendezvous import local_command


def test_rewrites_the_headless_endpoint_to_loopback_with_the_workloads_port() -> None:
    cmd = ["python3", "-m", "torch.distributed.run", "--nnodes=2", "--rdzv_backend=c10d",
           "--rdzv_endpoint=train-a1-0.train-a1-headless:29500", "--rdzv_id=train-a1", "train.py"]
    out = local_command(cmd, job="train-a1", subdomain="train-a1-headless", port=41234)
    assert out[5] == "--rdzv_endpoint=127.0.0.1:41234"
    assert out[:5] == cmd[:5] and out[6:] == cmd[6:]


def test_leaves_single_pod_commands_alone() -> None:
    cmd = ["python3", "train.py", "--host", "x-0.y"]
    assert local_command(cmd, job="x", subdomain="", port=1) == cmd


ELASTIC = ["python3", "-m", "torch.distributed.run", "--nnodes=2:3", "--nproc_per_node=1", "--max-restarts=100",
           "--rdzv_backend=c10d", "--rdzv_endpoint=el-a1-0.el-a1-headless:29500", "--rdzv_id=el-a1", "train.py"]


def test_only_pod_0_hosts_the_rendezvous_store_on_loopback() -> None:
    """Every pod's address is loopback here: without is_host, the first agent up would host the store, and an
    elastic shrink stopping it would end the run."""
    first = local_command(ELASTIC, job="el-a1", subdomain="el-a1-headless", port=41234, index=0)
    third = local_command(ELASTIC, job="el-a1", subdomain="el-a1-headless", port=41234, index=2)
    assert first[7:9] == ["--rdzv_endpoint=127.0.0.1:41234", "--rdzv_conf=is_host=true"]
    assert third[7:9] == ["--rdzv_endpoint=127.0.0.1:41234", "--rdzv_conf=is_host=false"]
    assert first[:7] == third[:7] == ELASTIC[:7] and first[9:] == third[9:] == ELASTIC[8:]


def test_is_host_joins_the_commands_own_rendezvous_conf_and_replaces_its_is_host() -> None:
    cmd = [*ELASTIC[:-1], "--rdzv_conf=read_timeout=120,is_host=true", "train.py"]
    out = local_command(cmd, job="el-a1", subdomain="el-a1-headless", port=41234, index=1)
    assert out[9:] == ["--rdzv_conf=read_timeout=120,is_host=false", "train.py"] and len(out) == len(cmd)


def test_a_fixed_size_runs_command_is_left_as_rendered() -> None:
    fixed = ["python3", "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=$(JOB_COMPLETION_INDEX)",
             "--rdzv_backend=c10d", "--rdzv_endpoint=tr-a1-0.tr-a1-headless:29500", "train.py"]
    out = local_command(fixed, job="tr-a1", subdomain="tr-a1-headless", port=41234, index=1)
    assert out == [*fixed[:6], "--rdzv_endpoint=127.0.0.1:41234", "train.py"]
