"""Runtime patch of an installed DeepSpeed: the site table (sites), the wrappers (seams), apply/undo (apply)."""
from .apply import PatchError, PatchReport, patch, unpatch

__all__ = ["PatchError", "PatchReport", "patch", "unpatch"]
