"""The wire formats, as arithmetic and layout constants shared by every backend (docs/numerics.md describes them).

- :mod:`.int8`: the 8-bit weight wire of qwZ and MixZ++ (per-group scale rule; group layout: ``grouping``).
- :mod:`.int4`: the 4-bit gradient wire of qgZ (codec per group, block layout, error-feedback weights).

The CUDA kernels hold the same constants once, in ``csrc/formats.cuh``.
"""
