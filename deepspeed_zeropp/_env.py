"""The environment variables of the patch, read in one place (``_autoactivate`` acts on them, ``agreement`` reads
its switch and its bound, ``doctor`` checks them, the launcher seam forwards them); importing this module has no side
effects."""
import os

ENV = "DEEPSPEED_ZEROPP"
BACKEND_ENV = "DEEPSPEED_ZEROPP_BACKEND"
AGREEMENT_ENV = "DEEPSPEED_ZEROPP_AGREEMENT"
AGREEMENT_TIMEOUT_ENV = "DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT"
PREFIX = ENV  # every variable of the patch starts with it: what DeepSpeed's multi-node launcher is made to forward
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


def ours(environ=None):
    """The patch's variables set in ``environ`` (default ``os.environ``), by name."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items() if name.startswith(PREFIX)}


def agreement_wanted():
    """Whether the ranks check that they all run the patch alike (``agreement``): ``DEEPSPEED_ZEROPP_AGREEMENT``
    unset or on (the default), or off (for a launcher known to patch every rank, or a store that cannot hold keys).
    Any other value raises ValueError naming the accepted ones."""
    raw = os.environ.get(AGREEMENT_ENV)
    value = (raw or "").strip().lower()
    if not value or value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError(f"{AGREEMENT_ENV}={raw!r} is not understood; accepted values: {', '.join(ON)} or unset (every "
                     f"rank checks at its first quantized collective that all run the patch alike: the default) or "
                     f"{', '.join(v for v in OFF if v)} (no check, for a launcher known to patch every rank)")


def agreement_timeout(default):
    """Seconds a rank waits for every other rank's answer (``agreement``): ``DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT``,
    else ``default``. Anything but a positive number of seconds raises ValueError saying what is accepted."""
    value = os.environ.get(AGREEMENT_TIMEOUT_ENV, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = None
    if seconds is None or not 0 < seconds < float("inf"):
        raise ValueError(f"{AGREEMENT_TIMEOUT_ENV}={value!r} is not a positive number of seconds; unset it for the "
                         f"default ({default:g} s)")
    return seconds
