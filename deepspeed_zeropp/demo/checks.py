"""What a run reports beside its losses, without changing what it runs: calls counted through DeepSpeed's quantizer
and gather handles (:class:`Counters`, proof that quantization ran) and the forward checks (:class:`ForwardChecks`:
every parameter's dtype at every forward, and gathered values against the originals). The demo's worker uses them;
the test harness builds on them."""


class Counters:
    """Counts calls through DeepSpeed's quantizer and gather handles without changing what they do."""

    def __init__(self):
        self.counts = {}
        self._restore = []

    def spy(self, owner, attr, key, when=lambda *a, **k: True):
        original = owner.__dict__[attr]

        def counting(*args, **kwargs):
            if when(*args, **kwargs):
                self.counts[key] = self.counts.get(key, 0) + 1
            return original(*args, **kwargs)

        setattr(owner, attr, counting)
        self._restore.append((owner, attr, original))

    def install(self):
        from deepspeed.runtime.zero import partition_parameters as pp
        self.spy(pp.CUDAQuantizer, "quantize", "quantize")
        self.spy(pp.CUDAQuantizer, "dequantize", "dequantize")
        # a fetch that sent packets is dequantized by the fetch protocol, not through the quantizer
        from ..patching.seams import fetch
        self.spy(fetch, "complete_single", "dequantize")
        self.spy(fetch, "complete_bucket", "dequantize")
        self.spy(pp.AllGatherHandle, "wait", "quantized_single_gathers",
                 lambda h, *a, **k: getattr(h, "_AllGatherHandle__quantization", None) is not None)
        self.spy(pp.AllGatherCoalescedHandle, "wait", "quantized_bucket_gathers",
                 lambda h, *a, **k: getattr(h, "quantization", None) is not None)

    def remove(self):
        for owner, attr, original in reversed(self._restore):
            setattr(owner, attr, original)


class ForwardChecks:
    """At every module forward (after ZeRO-3 gathered its parameters): dtype kept, and values still equal to
    the originals within the int8 bound wherever they cannot have been trained yet (frozen, or before step 1)."""

    def __init__(self, model, originals=None):
        """``originals``: full values by parameter, for models already partitioned at construction. Without a
        model nothing is expected (step-time runs: no full-precision copy of a model that may fill the device)."""
        originals = originals or {}
        self.expected = {
            p: (n, p.dtype, originals.get(p, p).detach().float().clone(), p.requires_grad)
            for n, p in (model.named_parameters() if model is not None else ())
        }
        self.checks = 0
        self.dtype_errors = []
        self.value_errors = []
        self.max_rel_error = 0.0
        self.trained = False
        self.largest = max((original.abs().max().item() for _, _, original, _ in self.expected.values()), default=0.0)

    def hook(self, module, inputs):
        for param in module.parameters(recurse=False):
            name, dtype, original, trainable = self.expected[param]
            self.checks += 1
            if param.dtype != dtype:
                self.dtype_errors.append(f"{name}: {param.dtype} (expected {dtype})")
            elif (not trainable or not self.trained) and param.numel() == original.numel():
                self.compare(name, param.detach().float().view(original.shape), original)

    def compare(self, name, gathered, original):
        """A coalesced bucket quantizes groups that span neighbouring parameters, so a group's absmax can come
        from the largest parameter in the model: one int8 step of that (absmax/128; +absmax itself clamps from
        code 128 to 127), plus the dtype's rounding, bounds the error. Garbage (bits misread, uninitialised
        buffers) is off by the values' own size."""
        error = (gathered - original.to(gathered.device)).abs().max().item()
        own = original.abs().max().item() or 1.0
        self.max_rel_error = max(self.max_rel_error, error / own)
        if not error <= self.largest / 128 + own * 2**-8:
            self.value_errors.append(f"{name}: max error {error:.3g} (absmax {own:.3g})")

    def attach(self, model):
        for module in model.modules():
            module.register_forward_pre_hook(self.hook)
