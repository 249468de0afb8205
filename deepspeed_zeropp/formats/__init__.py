"""The wire formats, as arithmetic and layout constants shared by every backend (docs/numerics.md describes them).

- :mod:`.int8`: the 8-bit weight wire of qwZ and MixZ++ (per-group scale rule, packets).
- :mod:`.grouping`: the int8 group layout, a pure function of numel.
- :mod:`.int4`: the 4-bit gradient wire of qgZ (codec per group, block layout, error-feedback weights).
- :mod:`.dtypes`: the element dtypes every format accepts, their checks and their names.

The CUDA side holds the int4 constants once, in ``csrc/wire_formats.h``; the int8 rule is in ``csrc/quantize.cu``.
"""

# The version of these formats as ranks exchange them: int8 codes with their scales and group layout, int4 qgZ blocks
# with their codec. Every rank of a job must run the same version (agreement.py checks at the first quantized
# collective); bump it with any change to the bytes a rank sends or to how a rank reads what it receives.
WIRE_FORMAT_VERSION = 2  # 2: a weight fetch sends codes and scales as one packet per rank (docs/numerics.md)
