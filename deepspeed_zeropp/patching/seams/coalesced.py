"""Init's synchronous gather of a list of unquantized partitions, as one all-gather per partition group and dtype.

After every optimizer step ZeRO-3 gathers its persistent parameters again (``stage3_param_persistence_threshold``:
the small ones, layer norms and biases, kept whole on every rank), through ``Init._allgather_params_coalesced``,
which issues one all-gather per parameter: a 7B GPT's 258 persistent parameters are 258 collectives a step, each
paying the ring's latency over the whole world and none hidden behind compute (the step waits for them). Here each
rank sends the concatenation of its partitions in one all-gather; every rank's copy of each parameter is then put
back together with one copy per run of equally sized partitions (a run of ``k`` partitions of ``n`` elements from
``world`` ranks is read as ``[world, k, n]`` and written as ``[k, world, n]``), so each parameter's data is its
gathered values in DeepSpeed's layout (rank-major, padding last), exactly what the per-parameter all-gathers give.

Lists are cut into all-gathers of at most :data:`MAX_GATHERED_NUMEL` gathered elements: the copy briefly holds a
second gathered buffer, which this bounds (a list of whole weights, as ``GatheredParameters`` may gather, would
otherwise hold twice the model). A partition larger than that is one all-gather on its own, read without a copy.
"""
import itertools

import torch

from ...qgz import batches  # consecutive runs within a size limit, as qgZ batches its all-to-alls
from .common import accelerator as _accelerator

MAX_GATHERED_NUMEL = 1 << 24  # gathered elements per all-gather (32 MiB of bf16): the copy's extra memory


def _numel(param):
    return param.ds_tensor.ds_numel


def chunks(params, world):
    """``params`` sorted by partition numel, cut into lists of at most MAX_GATHERED_NUMEL gathered elements (a
    larger partition alone)."""
    ordered = sorted(params, key=_numel)
    for batch in batches([_numel(p) * world for p in ordered], MAX_GATHERED_NUMEL):
        yield [ordered[i] for i in batch]


def assign(params, gathered, world):
    """Each parameter's data from ``gathered``, ``world`` ranks' concatenations of the partitions of ``params`` (in
    this order, each ``ds_tensor.ds_numel`` long): cut to ``ds_numel``, shaped ``ds_shape``."""
    rows = gathered.view(world, -1)
    offset = 0
    for numel, run in itertools.groupby(params, key=_numel):
        run = list(run)
        # a copy, unless the run is the whole buffer and one partition (already each rank's part in a row)
        block = rows[:, offset:offset + numel * len(run)].reshape(world, len(run), numel).transpose(0, 1).contiguous()
        for param, values in zip(run, block):
            param.data = values.view(-1).narrow(0, 0, param.ds_numel).view(param.ds_shape).data
        offset += numel * len(run)


def applies(init, params):
    """Whether ``gather`` takes this list: partitions present, none stored as MixZ++ codes, every partition group
    of more than one rank (DeepSpeed's own path for one rank gathers nothing)."""
    import torch.distributed
    if any(p.ds_tensor is None or hasattr(p.ds_tensor, "ds_quant_scale") for p in params):
        return False
    groups = {id(group): group for group in map(init.get_partition_dp_group, params)}
    return all(torch.distributed.get_world_size(group=group) > 1 for group in groups.values())


def gather(init, params):
    """Gather the unquantized partitions of ``params`` (``Init._allgather_params_coalesced`` with
    ``quantize=False``) in one all-gather per partition group, dtype and chunk; ends as the original does, with
    a device synchronization where the accelerator does not order streams itself."""
    from deepspeed import comm as dist
    accelerator = _accelerator()
    device = accelerator.device_name()
    lists = {}
    for param in params:
        group = init.get_partition_dp_group(param)
        lists.setdefault((id(group), param.ds_tensor.dtype), (group, []))[1].append(param)
    launched = []
    for group, members in lists.values():
        world = dist.get_world_size(group=group)
        for chunk in chunks(members, world):
            sent = torch.cat([p.ds_tensor.to(device).view(-1).narrow(0, 0, _numel(p)) for p in chunk])
            gathered = torch.empty(world * sent.numel(), dtype=sent.dtype, device=init.local_device)
            if getattr(init, "use_all_gather_into_tensor", True):
                work = dist.all_gather_into_tensor(gathered, sent, group=group, async_op=True)
            else:
                work = dist.all_gather(list(gathered.view(world, -1).unbind(0)), sent, group=group, async_op=True)
            launched.append((work, chunk, gathered, world))
    launched.reverse()
    while launched:  # each gathered buffer is dropped once read: at most one chunk's copy beside the buffers
        work, chunk, gathered, world = launched.pop()
        work.wait()
        assign(chunk, gathered, world)
        del gathered
    if not accelerator.resolves_data_dependency():
        accelerator.synchronize()
    return None
