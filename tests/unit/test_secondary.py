"""hpZ's secondary partitions: written without DeepSpeed's host wait when ZeRO++ quantizes on an accelerator that
needs it, and the coordinator's next fetch orders its all-gather stream after the writing stream, once."""
import types

import pytest
import torch

from deepspeed_zeropp.patching import installed
from deepspeed_zeropp.patching.seams import partitions, secondary


class Accelerator:
    """What the seams ask of DeepSpeed's accelerator: whether it orders streams itself, and the current stream."""

    def __init__(self, resolves):
        self.resolves, self.stream = resolves, object()

    def resolves_data_dependency(self):
        return self.resolves

    def current_stream(self):
        return self.stream


class Stream:

    def __init__(self, events):
        self.events = events

    def wait_stream(self, stream):
        self.events.append(("wait", stream))


@pytest.fixture
def accelerator(monkeypatch, request):
    accelerator = Accelerator(resolves=request.param)
    monkeypatch.setattr(secondary, "_accelerator", lambda: accelerator)
    monkeypatch.setattr(secondary, "_written", [])
    monkeypatch.setitem(installed.replaced, secondary.ORDER_SITE, None)  # the coordinator's seam is installed
    return accelerator


def partition_sec(accelerator, events):
    """A stand-in for ``_partition_param_sec``: writes a secondary partition, then DeepSpeed's host wait."""

    def original(init, param, *args, **kwargs):
        param.ds_secondary_tensor = torch.zeros(4)
        param.ds_secondary_tensor.ds_numel = 4
        if not accelerator.resolves_data_dependency():
            events.append("host wait")

    return original


def release(accelerator, quantized, events):
    param = torch.nn.Parameter(torch.empty(0))
    param.ds_numel, param.ds_secondary_tensor = 8, None
    init = types.SimpleNamespace(quantized_weights=quantized, quantized_nontrainable_weights=False, rank_in_group=0)
    partitions.partition_param_sec(partition_sec(accelerator, events))(init, param)
    return param


def fetch(events):
    coordinator = types.SimpleNamespace(_PartitionedParameterCoordinator__allgather_stream=Stream(events))
    secondary.coordinator_fetch(lambda coordinator, params, forward: events.append("gather"))(coordinator, [], True)


@pytest.mark.parametrize("accelerator", [False], indirect=True)
def test_written_without_host_wait_then_gathered_after_the_writing_stream(accelerator):
    events = []
    for _ in range(3):  # three parameters released on the same stream: one wait at the next fetch
        release(accelerator, quantized=True, events=events)
    assert events == [] and accelerator.resolves_data_dependency() is False
    assert "resolves_data_dependency" not in vars(accelerator)  # the method again, not a leftover stand-in
    fetch(events)
    fetch(events)
    assert events == [("wait", accelerator.stream), "gather", "gather"]


@pytest.mark.parametrize("accelerator", [False], indirect=True)
def test_unquantized_keeps_deepspeed_host_wait(accelerator):
    events = []
    release(accelerator, quantized=False, events=events)
    fetch(events)
    assert events == ["host wait", "gather"]


@pytest.mark.parametrize("accelerator", [True], indirect=True)
def test_accelerator_that_orders_streams_is_left_alone(accelerator):
    """The CPU accelerator resolves data dependencies itself: nothing is skipped, noted or waited for."""
    events = []
    release(accelerator, quantized=True, events=events)
    fetch(events)
    assert events == ["gather"]


@pytest.mark.parametrize("accelerator", [False], indirect=True)
def test_failed_write_restores_the_accelerator_and_still_orders(accelerator):
    own = accelerator.resolves_data_dependency
    accelerator.resolves_data_dependency = own  # an instance attribute someone else set: kept

    def failing(init, param, *args, **kwargs):
        raise RuntimeError("out of memory")

    param = torch.nn.Parameter(torch.empty(0))
    param.ds_numel, param.ds_secondary_tensor = 8, None
    init = types.SimpleNamespace(quantized_weights=True, quantized_nontrainable_weights=False, rank_in_group=0)
    with pytest.raises(RuntimeError, match="out of memory"):
        partitions.partition_param_sec(failing)(init, param)
    assert vars(accelerator)["resolves_data_dependency"] is own
    events = []
    fetch(events)
    assert events == [("wait", accelerator.stream), "gather"]


@pytest.mark.parametrize("accelerator", [False], indirect=True)
def test_host_wait_kept_without_the_coordinator_seam(accelerator, monkeypatch):
    """Nothing would order the gathers after the write: DeepSpeed's host wait stays."""
    monkeypatch.delitem(installed.replaced, secondary.ORDER_SITE)
    events = []
    release(accelerator, quantized=True, events=events)
    fetch(events)
    assert events == ["host wait", "gather"]


def test_order_site_names_the_coordinator_row():
    from deepspeed_zeropp.patching.sites import SITES
    assert [site.name for site in SITES if site.factory is secondary.coordinator_fetch] == [secondary.ORDER_SITE]
