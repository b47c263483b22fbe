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
