"""qgZ's batches on the link: every batch's inter-node all-to-all is launched before any batch is decoded, so the
current stream never waits for one all-to-all before the next batch's first stage and all-to-all are launched; the
caller's ``on_read`` runs after the last read of the gradients (the last batch's first stage), before any wait."""
import torch

from deepspeed_zeropp import qgz


class _Work:

    def __init__(self, log):
        self.log = log

    def wait(self):
        self.log.append("wait")


class _Kernels:

    def __init__(self, log):
        self.log = log

    def qgz_encode(self, flat, destinations, rows, chunk, padded, feedback):
        self.log.append("encode")
        return torch.zeros(destinations, 8, dtype=torch.uint8)

    def qgz_decode_sum(self, received, padded, mine, factor, dtype):
        self.log.append("decode")
        return torch.zeros(mine, dtype=dtype)


def test_every_batch_is_sent_before_any_is_decoded(monkeypatch):
    log = []
    monkeypatch.setattr(qgz, "codec", lambda device: _Kernels(log))
    monkeypatch.setattr(qgz, "BATCH_BYTES", 1)  # one gradient a batch

    def all_to_all(blocks, group, async_op=False):
        log.append(f"all_to_all {group}")
        received = torch.empty_like(blocks)
        return (received, _Work(log)) if async_op else received

    monkeypatch.setattr(qgz, "_all_to_all", all_to_all)
    topology = qgz.Topology(world=2, local_size=1, nodes=2, rank=0, factor=0.5)
    gradients = [torch.ones(4, 4) for _ in range(3)]
    chunks = qgz._reduce_scatter_quantized(gradients, [None] * 3,
                                           topology, {"global_0": "g"},
                                           on_read=lambda: log.append("read"))
    assert [c.numel() for c in chunks] == [8, 8, 8]
    assert log == ["encode", "all_to_all g"] * 3 + ["read"] + ["wait", "decode"] * 3
