"""The package's version, in one place: the package (``deepspeed_zeropp.__version__``), the agreement check (what a
rank runs) and the wheel's metadata (pyproject.toml reads it) take it from here. Imports nothing."""
__version__ = "0.1.0"
