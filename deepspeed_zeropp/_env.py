"""The environment variables that activate the patch, read in one place (``_autoactivate`` acts on them,
``doctor`` checks them); importing this module has no side effects."""
import os

ENV = "DEEPSPEED_ZEROPP"
BACKEND_ENV = "DEEPSPEED_ZEROPP_BACKEND"
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")


def requested():
    """True, False, or None for a value that is neither."""
    value = os.environ.get(ENV, "").strip().lower()
    return True if value in ON else False if value in OFF else None


def unrecognised_message():
    return (f"{ENV}={os.environ.get(ENV)!r} is not understood, so DeepSpeed is not patched; accepted values: "
            f"{', '.join(ON)} (patch) or {', '.join(v for v in OFF if v)} or unset (do not patch)")


def backend():
    return os.environ.get(BACKEND_ENV, "auto")
