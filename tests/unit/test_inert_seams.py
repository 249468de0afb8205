"""The seams do no work without a ZeRO++ flag, and padding is zeroed only where a partition holds its values."""
import types

import pytest
import torch

from deepspeed_zeropp.patching.seams import common, gathers, partitions


def zero_param(ds_numel, partition):
    param = torch.nn.Parameter(torch.empty(0), requires_grad=True)
    param.ds_numel, param.ds_tensor = ds_numel, partition
    partition.ds_numel = partition.numel()
    return param


def partitioning(partition, calls=None):
    """A stand-in for DeepSpeed's ``_partition_param`` on a parameter not partitioned yet: it writes ``partition``."""

    def original(init, param, *args, **kwargs):
        if calls is not None:
            calls.append(args)
        param.ds_tensor = partition
        partition.ds_numel = partition.numel()

    return original


def init(quantized):
    return types.SimpleNamespace(quantized_weights=quantized,
                                 quantized_nontrainable_weights=False,
                                 get_partition_dp_group=lambda param: None)


@pytest.fixture
def last_rank(monkeypatch):
    """Rank 1 of 2: a 9-element parameter has 4 values and 1 padding element in its 5-element partition."""
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)


def test_released_nvme_partition_is_left_alone(last_rank):
    """DeepSpeed releases an NVMe-offloaded partition by pointing ``ds_tensor.data`` at a one-element fp16
    buffer; the padding cannot be (and need not be) zeroed then."""
    param = zero_param(9, torch.full((5, ), float("nan"), dtype=torch.bfloat16))
    param.ds_tensor = None

    def partition_and_release(init, param, *args, **kwargs):
        partitioning(torch.full((5, ), float("nan"), dtype=torch.bfloat16))(init, param)
        param.ds_tensor.data = torch.tensor(1).half().data

    partitions.partition_param(partition_and_release)(init(quantized=True), param)
    assert param.ds_tensor.numel() == 1 and param.ds_tensor.item() == 1


def test_padding_zeroed_when_quantized_untouched_when_off(last_rank):
    """Where DeepSpeed writes a partition: the first partitioning, and a rewrite (``has_been_updated``)."""
    for quantized in (True, False):
        for updated in (False, True):
            values = torch.tensor([1.0, 2.0, 3.0, 4.0, float("nan")])
            param = zero_param(9, torch.zeros(5))
            if not updated:
                param.ds_tensor = None
            calls = []
            partitions.partition_param(partitioning(values.clone(), calls))(init(quantized), param, None, updated)
            assert len(calls) == 1
            assert torch.equal(param.ds_tensor[:4], values[:4])
            assert param.ds_tensor[4].item() == 0 if quantized else param.ds_tensor[4].isnan()


def test_release_after_a_fetch_calls_straight_through(monkeypatch):
    """A partition that exists and is not rewritten (every release of gathered weights): DeepSpeed's method alone,
    no rank lookup, no zeroing."""
    monkeypatch.setattr(partitions, "_partition_rank", lambda *a: pytest.fail("rank looked up"))
    monkeypatch.setattr(partitions, "_zero_padding", lambda *a: pytest.fail("padding zeroed"))
    param = zero_param(9, torch.tensor([1.0, 2.0, 3.0, 4.0, float("nan")]))
    calls = []
    partitions.partition_param(lambda *a, **k: calls.append(a))(init(quantized=True), param)
    partitions.partition_param(lambda *a, **k: calls.append(a))(init(quantized=True), param, has_been_updated=False)
    assert len(calls) == 2 and param.ds_tensor[4].isnan()


def test_init_gathers_call_straight_through_when_nothing_is_quantized(monkeypatch):
    """No dequantize scope, no dtype restoring: unquantized lists go to DeepSpeed's method untouched."""
    for module in (common, gathers):
        monkeypatch.setattr(module, "dequant_target", lambda *a, **k: pytest.fail("dequantize scope opened"))
        monkeypatch.setattr(module, "restore_dtypes", lambda *a, **k: pytest.fail("dtypes restored"))
    param = zero_param(8, torch.zeros(4))
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "result"

    fake_init = init(quantized=False)
    assert gathers.init_gather_coalesced(original)(fake_init, [param], 0, quantize=False) == "result"
    assert gathers.init_gather_sequential(original)(fake_init, [param]) == "result"
    assert gathers.init_gather_single(original)(fake_init, [param]) == "result"
    assert len(calls) == 3


@pytest.mark.parametrize("quantized", [True, False])
def test_init_coalesced_gather_splits_lists_only_when_quantizing(monkeypatch, quantized):
    """Up to 0.19.5 Init's coalesced gather waits on its list's last all-gather only: with a ZeRO++ flag the seam
    hands it a quantized list one parameter per call; without one, the stock call runs untouched."""
    monkeypatch.setattr(gathers, "_init_layout", lambda *a, **k: {})  # the codes' layout needs a process group
    calls = []

    def original(init, params, hierarchy=0, quantize=False):
        calls.append([id(p) for p in params])

    params = [zero_param(4, torch.zeros(2)) for _ in range(3)]
    gathers.init_gather_coalesced(original)(init(quantized), params, 0, quantize=True)
    expected = [[id(p)] for p in params] if quantized else [[id(p) for p in params]]
    assert calls == expected


@pytest.mark.parametrize("quantized", [True, False])
def test_init_coalesced_gather_of_unquantized_lists(monkeypatch, quantized):
    """A list of unquantized partitions (the persistent parameters after every step): with a ZeRO++ flag one
    gather of the whole list by coalesced.py (one all-gather per group and dtype); without one, the stock call."""
    calls = []
    monkeypatch.setattr(gathers.coalesced, "applies", lambda init, params: True)
    monkeypatch.setattr(gathers.coalesced, "gather", lambda init, params: calls.append(("ours", len(params))))

    def original(init, params, hierarchy=0, quantize=False):
        calls.append(("stock", len(params)))

    params = [zero_param(4, torch.zeros(2)) for _ in range(3)]
    gathers.init_gather_coalesced(original)(init(quantized), params, 0, quantize=False)
    gathers.init_gather_coalesced(original)(init(quantized), params[:1], 0, quantize=False)
    assert calls == ([("ours", 3)] if quantized else [("stock", 3)]) + [("stock", 1)]


def test_init_coalesced_gather_keeps_in_order_lists_whole(monkeypatch):
    """NCCL completes one group's all-gathers in launch order and every call ends in a device synchronization: such
    a list stays one call (one synchronization, not one per parameter); gloo, or two groups, split it."""
    calls, backends = [], {"first": "nccl", "second": "nccl", "cpu": "gloo"}
    monkeypatch.setattr(gathers, "_init_layout", lambda *a, **k: {})
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: backends[group])

    def original(init, params, hierarchy=0, quantize=False):
        calls.append(len(params))

    params = [zero_param(4, torch.zeros(2)) for _ in range(3)]
    for groups, expected in (({}, [3]), ({id(params[0]): "second"}, [1, 1, 1])):
        quantizing = init(quantized=True)
        quantizing.get_partition_dp_group = lambda param, groups=groups: groups.get(id(param), "first")
        calls.clear()
        gathers.init_gather_coalesced(original)(quantizing, params, 0, quantize=True)
        assert calls == expected
    gloo = init(quantized=True)
    gloo.get_partition_dp_group = lambda param: "cpu"
    calls.clear()
    gathers.init_gather_coalesced(original)(gloo, params, 0, quantize=True)
    assert calls == [1, 1, 1]
