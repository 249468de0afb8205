"""The seam at DeepSpeed's multi-node launcher: the patch's variables reach every node.

``deepspeed --hostfile ...`` starts the ranks of the other nodes through a runner (pdsh, OpenMPI, MVAPICH, Slurm,
Intel MPI, MPICH) that passes on only the variables with the launcher's export prefixes and the lines of
``.deepspeed_env``; ``DEEPSPEED_ZEROPP`` is none of them. The ``deepspeed`` command imports DeepSpeed, so with
``DEEPSPEED_ZEROPP=1`` the patch is active in the launcher too, and this seam adds the patch's variables to the
exports of every runner it builds.
"""
import os

from ... import _env


def forward_variables(original):
    """Why this seam: DeepSpeed's multi-node launcher (deepspeed --hostfile) starts the other nodes' ranks through a
    runner (pdsh, OpenMPI, MVAPICH, Slurm, Intel MPI, MPICH) that forwards only the variables with its export
    prefixes and the lines of .deepspeed_env, so DEEPSPEED_ZEROPP=1 would patch the launching node's ranks alone.
    Every runner sets up its exports in this base constructor, and every runner's command is built from them: the
    wrapper adds the DEEPSPEED_ZEROPP* variables of the launcher's environment there, before the launcher's own
    exports and .deepspeed_env (a value given there wins).

    Seam factory for ``MultiNodeRunner.__init__``: after the runner is set up (its exports empty), export the
    patch's variables from the launcher's environment through the runner's own ``add_export``, so every runner
    writes them in its command its own way. The launcher adds its own exports and ``.deepspeed_env``'s lines
    afterwards, so a value given there wins."""

    def wrapper(runner, *args, **kwargs):
        result = original(runner, *args, **kwargs)
        for name, value in sorted(_env.ours().items()):
            runner.add_export(name, value)
        return result

    return wrapper


def probe(environ):
    """The patch's variables a runner built by the installed launcher would export, given the launcher's
    environment ``environ`` (for ``doctor``: a runner of DeepSpeed's base class, built as the launcher builds one,
    with the abstract parts filled in; nothing is launched)."""
    from unittest import mock

    from deepspeed.launcher import multinode_runner, runner

    class Probe(multinode_runner.MultiNodeRunner):

        def backend_exists(self):
            return False

        def get_cmd(self, environment, active_resources):
            return []

    with mock.patch.dict(os.environ, environ, clear=True):
        built = Probe(runner.parse_args(["probe.py"]), "e30=")
    return {name: value for name, value in built.exports.items() if name.startswith(_env.PREFIX)}
