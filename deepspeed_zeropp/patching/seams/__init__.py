"""Wrappers installed at DeepSpeed's sites, by concern; each seam factory's docstring says why that seam (the site
table in ``patching/sites.py`` and the installed wrapper read it).

- :mod:`.common`: marking wrappers, a parameter's own dtype, the dtype-scoped gather mechanism.
- :mod:`.gathers`: all-gather and NoGather handles, Init's synchronous gathers.
- :mod:`.partitions`: MixZ++ partitions and the padding of the last rank's partition.
- :mod:`.secondary`: hpZ's secondary partitions written without a host wait, gathered in stream order.
- :mod:`.checkpoints`: frozen (MixZ++) fragments in checkpoints.
- :mod:`.replacements`: the quantizer's methods and the qgZ/LoCo collectives, replaced whole.
- :mod:`.launcher`: DeepSpeed's multi-node launcher, made to forward the patch's variables to every node.
"""
