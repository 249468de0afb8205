"""The sites the patch has replaced now: written by apply.py, read there and by seams that depend on other sites
(the fetch seam sends packets only while the seams that read them are installed). A module of its own because
apply imports the seams through the site table, so a seam cannot import apply."""

replaced = {}  # site name -> (owner class or module, attr, its __dict__ value before patching, or apply's _MISSING)


def is_patched(name=None):
    """Whether the site ``name`` (``Site.name``) is patched now; without a name, whether any site is."""
    return bool(replaced) if name is None else name in replaced
