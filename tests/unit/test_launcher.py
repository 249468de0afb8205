"""DeepSpeed's multi-node launcher carries the patch's variables to every node while the patch is active in it: the
command of each runner, built by DeepSpeed's own ``deepspeed.launcher.runner.main`` from a hostfile (nothing is
launched: the process it would start is recorded instead); accelerate's multi-node DeepSpeed launch; doctor."""
import os

import pytest

import deepspeed_zeropp
from deepspeed_zeropp import cli

LAUNCHERS = ("pdsh", "openmpi", "mvapich", "slurm", "impi", "mpich")
OURS = {"DEEPSPEED_ZEROPP": "1", "DEEPSPEED_ZEROPP_BACKEND": "torch"}


@pytest.fixture
def launch_dir(tmp_path, monkeypatch):
    """A working directory with a 2-node hostfile, our variables set, the runners' backends "installed", their
    side files kept in ``tmp_path``, and the launcher's subprocess and signal handlers recorded instead of used."""
    from deepspeed.launcher import multinode_runner, runner
    (tmp_path / "hostfile").write_text("node-a slots=2\nnode-b slots=2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in OURS.items():
        monkeypatch.setenv(name, value)
    for cls in vars(multinode_runner).values():
        if isinstance(cls, type) and issubclass(cls, multinode_runner.MultiNodeRunner):
            monkeypatch.setattr(cls, "backend_exists", lambda self: True)
    if hasattr(multinode_runner, "MVAPICH_TMP_HOSTFILE"):
        monkeypatch.setattr(multinode_runner, "MVAPICH_TMP_HOSTFILE", str(tmp_path / "mvapich_hosts"))
    monkeypatch.setattr(runner.signal, "signal", lambda *args: None)
    started = []

    class Recorded:
        returncode = 0

        def __init__(self, cmd, env=None, **kwargs):
            started.append((list(cmd), dict(env or {})))

        def wait(self):
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", Recorded)
    yield tmp_path, started
    deepspeed_zeropp.unpatch()


def launcher_command(started, launcher, extra=()):
    """The command ``deepspeed --hostfile hostfile --launcher <launcher> train.py`` runs on the launching node."""
    from deepspeed.launcher import runner
    runner.main([
        "--hostfile", "hostfile", "--launcher", launcher, "--master_addr", "10.0.0.1", "--no_ssh_check", *extra,
        "train.py", "--lr", "1"
    ])
    return " ".join(started[-1][0])


def carries(command, name, value):
    """Whether ``command`` sets ``name`` to ``value`` in one of the runners' forms (``NAME=value``, ``NAME value``)."""
    return f"{name}={value}" in command or f"{name} {value}" in command


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_each_runner_carries_the_variables_when_patched(launch_dir, launcher):
    _, started = launch_dir
    unpatched = launcher_command(started, launcher)
    assert not any(name in unpatched for name in OURS), unpatched  # upstream forwards none of them
    deepspeed_zeropp.patch()
    command = launcher_command(started, launcher)
    assert all(carries(command, name, value) for name, value in OURS.items()), command
    assert "train.py --lr 1" in command
    deepspeed_zeropp.unpatch()
    assert launcher_command(started, launcher) == unpatched  # unpatch restores the launcher exactly


def test_deepspeed_env_keeps_the_last_word(launch_dir):
    tmp_path, started = launch_dir
    (tmp_path / ".deepspeed_env").write_text("DEEPSPEED_ZEROPP_BACKEND=auto\n")
    deepspeed_zeropp.patch()
    command = launcher_command(started, "pdsh")
    assert carries(command, "DEEPSPEED_ZEROPP_BACKEND", "auto"), command
    assert not carries(command, "DEEPSPEED_ZEROPP_BACKEND", "torch"), command
    assert carries(command, "DEEPSPEED_ZEROPP", "1"), command


def test_accelerate_multi_node_deepspeed_launch(launch_dir, monkeypatch):
    """``accelerate launch --num_machines 2 --deepspeed_multinode_launcher pdsh`` starts the ``deepspeed`` launcher
    with the caller's environment (and writes it to .deepspeed_env); that launcher, patched by DEEPSPEED_ZEROPP=1
    at its DeepSpeed import, builds a pdsh command carrying the variables."""
    pytest.importorskip("accelerate")
    from accelerate.commands import launch
    _, started = launch_dir  # accelerate's subprocess.Popen is the recorded one too
    args = launch.launch_command_parser().parse_args([
        "--use_deepspeed", "--mixed_precision", "bf16", "--dynamo_backend", "no", "--num_machines", "2",
        "--num_processes", "4", "--machine_rank", "0", "--main_process_ip", "10.0.0.1", "--main_process_port", "29500",
        "--deepspeed_hostfile", "hostfile", "--deepspeed_multinode_launcher", "pdsh", "train.py"
    ])
    launch.launch_command(args)
    (cmd, env), = [(cmd, env) for cmd, env in started if cmd[0] == "deepspeed"]  # (it also asks nvidia-smi)
    assert cmd[0] == "deepspeed" and "--hostfile" in cmd and env["DEEPSPEED_ZEROPP"] == "1"
    deepspeed_zeropp.patch()  # what DEEPSPEED_ZEROPP=1 does in that deepspeed process
    os.remove(".deepspeed_env")  # accelerate's copy of the environment would forward them too; without it:
    monkeypatch.setattr(os, "environ", dict(env))
    from deepspeed.launcher import runner
    runner.main(["--no_ssh_check"] + cmd[1:])  # no node to reach here
    command = " ".join(started[-1][0])
    assert command.startswith("pdsh") and all(carries(command, n, v) for n, v in OURS.items()), command


def test_doctor_says_whether_the_launcher_forwards(capsys, monkeypatch):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "[     ok] DeepSpeed's multi-node launcher (deepspeed --hostfile" in out and "forwards DEEPSPEED_ZEROPP" in out
    from deepspeed_zeropp.patching import sites
    without = tuple(site for site in sites.SITES if site.name != "MultiNodeRunner.__init__")
    monkeypatch.setattr("deepspeed_zeropp.patching.apply.SITES", without)
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "[warning] DeepSpeed's multi-node launcher will not forward DEEPSPEED_ZEROPP to the other nodes" in out
    assert ".deepspeed_env" in out
    deepspeed_zeropp.unpatch()
