"""Every rank of a job runs the patch with the same wire format, or the job stops before quantized data moves.

A rank that runs the patch sends and reads our wire format (``formats/``); a rank that does not (a node started
without ``DEEPSPEED_ZEROPP=1``) sends and reads upstream's. Mixed, the job either crashes on the unpatched ranks or,
on releases where upstream's path runs, decodes one format as the other without a word. :func:`ensure` stops that:
the patch's entry points that put quantized data on the wire (``patching/seams/replacements.py``: our quantizer's
``quantize`` and the qgZ/LoCo reduce-scatters; ``patching/seams/partitions.py``: MixZ++ after partitioning) call it
first, so a job without a ZeRO++ flag never reaches it.

Through the default process group's key-value store, not a collective: an unpatched rank never runs this code, so
a collective would wait for it for good (or meet one of its other collectives), while the store answers whatever
the other ranks do, within a bound. Round ``n`` (a process counts its checks; all patched ranks check in the same
order):

- rank ``r`` sets ``deepspeed_zeropp/agreement/<n>/rank<r>`` to what it runs (:class:`Answer`) and
  ``deepspeed_zeropp/agreement/<n>/<token>/rank<r>``, where the token is what must be equal on every rank: the
  wire-format version, the backend family (``backends.FAMILIES``) and whether quantized fetches go as packets (a
  patch that leaves the fetch seam out sends codes and scales apart, which packet readers cannot take);
- it waits, at most :func:`timeout` seconds, for every rank's key under its own token. All there: done, and the
  process does not check again for this backend. The sets are not answered by torch's TCPStore,
  so a fully patched job pays one round trip to the store per rank, once, and no collective;
- otherwise (a rank missing or different, or the store gone) it reads what every rank published and raises
  :class:`AgreementError` naming the ranks, their hosts where known, what each runs and how to fix it.

A store that cannot take part (its key-value calls not implemented, as in torch's ``FakeStore``, or failing at once)
raises :class:`AgreementError` naming the store, the call and torch's message, rather than torch's error or a wait
for the whole bound. Two worlds are not checked, and rank 0 says so in one line per process: torch's ``fake``
backend (one process standing for every rank: no peers to ask), and a job run with ``DEEPSPEED_ZEROPP_AGREEMENT=off``
(``_env.py``), for a launcher known to patch every rank alike; a rank left unpatched then goes unnoticed.
"""
import json
import logging
import os
import socket
from datetime import timedelta
from typing import NamedTuple

from . import _env, backends, formats
from ._version import __version__

TIMEOUT = 300.0  # seconds: far beyond the skew of healthy ranks reaching their first quantized collective
KEY = "deepspeed_zeropp/agreement"
FAKE_BACKEND = "fake"  # torch's process group without peers (torch.testing._internal.distributed.fake_pg)
STORE_CALLS = ("set", "wait", "check", "get")  # what the check needs of the process group's store
logger = logging.getLogger("deepspeed_zeropp")
_agreed = None  # the backend name of the last check that passed
_round = 0  # checks this process has started: the round of the next one
_noted = set()  # why checks were skipped, each said once per process


class AgreementError(RuntimeError):
    """Not every rank of the job runs the patch with this rank's wire format and backend family."""


class Answer(NamedTuple):
    """What one rank runs, as it publishes it."""
    host: str
    package: str  # deepspeed_zeropp's version
    deepspeed: str
    wire: int  # formats.WIRE_FORMAT_VERSION
    backend: str
    family: str
    packets: bool = True  # quantized fetches as one packet per rank (the fetch seam and its readers patched)

    @property
    def token(self):
        """What every rank must have in common."""
        return f"wire{self.wire}-{self.family}-{'packets' if self.packets else 'two-gathers'}"

    def runs(self):
        sends = "codes and scales in one packet" if self.packets else "codes and scales in two all-gathers"
        return (f"deepspeed_zeropp {self.package} on DeepSpeed {self.deepspeed}, wire format {self.wire}, "
                f"backend {self.backend} ({self.family}), {sends}")

    def encode(self):
        return json.dumps(self._asdict())

    @classmethod
    def decode(cls, raw):
        return cls(**json.loads(raw.decode() if isinstance(raw, bytes) else raw))


def timeout():
    """The bound of the wait, in seconds: ``DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT`` (``_env.py``), else :data:`TIMEOUT`."""
    return _env.agreement_timeout(TIMEOUT)


def own_answer(packets):
    """This rank's :class:`Answer`; ``packets``: whether it sends quantized fetches as packets."""
    import deepspeed
    backend = backends.default()
    return Answer(socket.gethostname(), __version__, deepspeed.__version__, formats.WIRE_FORMAT_VERSION, backend,
                  backends.family(backend), packets)


def ensure(sends_packets):
    """Return once every rank of the default process group runs the patch with this rank's wire format and backend
    family; raise :class:`AgreementError` otherwise. Nothing to check without torch.distributed, with one rank or under
    torch's ``fake`` backend; not checked with ``DEEPSPEED_ZEROPP_AGREEMENT=off`` (a bad value raises ValueError).
    Checked once per process and backend: on the hot path (every quantize) only the backend name is compared, so a
    process group set up again in the same process (after ``destroy_process_group``) is not checked again.
    ``sends_packets``: a function answering whether this process sends quantized fetches as packets, called only
    when the check runs (the patch knows what it installed; this module, above it, does not ask)."""
    if _agreed == backends.default():
        return
    _check(sends_packets)


def _store():
    from torch.distributed import distributed_c10d
    return distributed_c10d._get_default_store()


def _check(sends_packets):
    global _agreed, _round
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        return
    wanted = _env.agreement_wanted()  # a bad value stops every world, also one that is not checked
    backend = backends.default()
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        pass  # no peer to disagree with
    elif dist.get_backend() == FAKE_BACKEND:
        _note(
            rank, FAKE_BACKEND, logging.INFO,
            f"deepspeed_zeropp: torch.distributed runs the '{FAKE_BACKEND}' backend ({world} ranks stood for by "
            f"this process, no peers): the check that every rank runs the patch alike does not run")
    elif not wanted:
        _note(
            rank, "off", logging.WARNING,
            f"deepspeed_zeropp: {_env.AGREEMENT_ENV}={os.environ.get(_env.AGREEMENT_ENV)}: the ranks do not check "
            f"that all run the patch alike; a rank left unpatched trains on different numerics without a word")
    else:
        prefix = f"{KEY}/{_round}"
        _round += 1  # also after a failed round: a later check never meets this round's keys
        exchange(_store(), rank, world, own_answer(sends_packets()), timeout(), prefix)
    _agreed = backend


def _note(rank, why, level, line):
    """Rank 0 logs ``line`` the first time this process skips the check for reason ``why``."""
    if rank == 0 and why not in _noted:
        logger.log(level, line)
    _noted.add(why)


def exchange(store, rank, world, mine, seconds, prefix):
    """Publish ``mine`` as rank ``rank`` under ``prefix`` in ``store`` and wait at most ``seconds`` for every rank's
    answer with the same token; raise :class:`AgreementError` if they are not all there."""
    for key, value in ((f"{prefix}/rank{rank}", mine.encode()), (f"{prefix}/{mine.token}/rank{rank}", "1")):
        try:
            store.set(key, value)
        except Exception as error:  # the first call: a store that cannot take keys says so here, at once
            raise AgreementError(store_message(store, "set", error, rank, world)) from error
    try:
        store.wait([f"{prefix}/{mine.token}/rank{peer}" for peer in range(world)], timedelta(seconds=seconds))
        return
    except Exception as error:  # the wait's timeout, or the store gone with the rank that held it (reading says)
        if _not_implemented(error):
            raise AgreementError(store_message(store, "wait", error, rank, world)) from error
    answers, unreadable = _read_answers(store, prefix, world)
    if unreadable is not None and _not_implemented(unreadable[1]):
        raise AgreementError(store_message(store, *unreadable, rank, world)) from unreadable[1]
    answers[rank] = mine
    raise AgreementError(
        message(rank, world, answers, seconds,
                None if unreadable is None else f"{type(unreadable[1]).__name__}: {unreadable[1]}"))


def _read_answers(store, prefix, world):
    """Every rank's published answer (None where there is none), and the call that could not read the store and its
    error (None if none failed)."""
    answers = {}
    for peer in range(world):
        key = f"{prefix}/rank{peer}"
        call = "check"
        try:
            if store.check([key]):
                call = "get"
                answers[peer] = Answer.decode(store.get(key))
            else:
                answers[peer] = None
        except Exception as error:
            return answers, (call, error)
    return answers, None


def _not_implemented(error):
    """Whether ``error`` says the store lacks the call (torch's words for a Python store missing a method, or a C++
    one whose method is abstract), as opposed to a timeout or a lost connection."""
    text = str(error)
    return (isinstance(error, (NotImplementedError, AttributeError, TypeError)) or "Not implemented" in text
            or "pure virtual" in text)


def store_name(store):
    """The store's class, seen through torch's ``PrefixStore`` (the default group's store is one, around the
    store the job was initialised with)."""
    import torch.distributed as dist
    wrappers = ""
    while isinstance(store, dist.PrefixStore):
        wrappers += " inside PrefixStore"
        store = store.underlying_store
    cls = type(store)
    module = "torch.distributed" if getattr(dist, cls.__name__, None) is cls else cls.__module__
    return f"{module}.{cls.__qualname__}{wrappers}"


def store_message(store, call, error, rank, world):
    """The error text for a store that cannot take part in the check: ``call`` (one of :data:`STORE_CALLS`) raised
    ``error``."""
    missing = _not_implemented(error)
    why = (f"this store does not implement {call}" if missing else
           f"its {call} failed: the process serving it (rank 0, or the launcher's agent) may have stopped")
    return (
        f"deepspeed_zeropp: rank {rank} of {world} cannot check, before its first quantized collective, that every "
        f"rank runs the patch alike: the process group's store ({store_name(store)}) failed at {call}: "
        f"{type(error).__name__}: {error}\n"
        f"The check needs the store's key-value calls ({', '.join(STORE_CALLS)}); {why}.\n"
        f"Fix: initialise torch.distributed with a store that implements them (the env:// or tcp:// rendezvous "
        f"gives a TCPStore, file:// a FileStore, or pass one as init_process_group(store=...); one process standing "
        f"for every rank runs torch's '{FAKE_BACKEND}' backend, which is not checked); or, where the "
        f"launcher is known to start every rank patched alike, set {_env.AGREEMENT_ENV}=off on every rank to skip "
        f"the check (accepted: on, the default, or off). Off, a rank left unpatched is not stopped: it trains on "
        f"different numerics without a word, or the job hangs or reads garbage.")


def _ranges(ranks):
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    spans = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _hosts(answers, limit=8):
    hosts = sorted({answer.host for answer in answers})
    shown = ", ".join(hosts[:limit]) + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")
    return f"host{'s' if len(hosts) > 1 else ''} {shown}"


def message(rank, world, answers, seconds, unreadable=None):
    """The error text: ``answers`` maps ranks to their :class:`Answer` or None (no answer); ranks absent from it
    could not be read (``unreadable`` says why)."""
    mine = answers[rank]
    groups = {}
    for peer, answer in sorted(answers.items()):
        groups.setdefault(None if answer is None else answer._replace(host=""), []).append(peer)
    lines = [
        f"deepspeed_zeropp: rank {rank} of {world} stops before its first quantized collective: not every rank runs "
        f"the patch with wire format {mine.wire} and backend family {mine.family}, and ranks that disagree would "
        f"read each other's quantized data wrongly. Ranks:"
    ]
    for runs, peers in groups.items():
        label = f"rank{'s' if len(peers) > 1 else ''} {_ranges(peers)}"
        if runs is None:
            lines.append(f"  {label} (host unknown): no answer within {seconds:g} s: the patch is not active there "
                         f"(or the rank never reached its first quantized collective)")
            continue
        if rank in peers:
            verdict = "this rank" if len(peers) == 1 else "as this rank"
        else:
            verdict = "agrees" if runs.token == mine.token else "DIFFERENT"
        hosts = _hosts(answers[peer] for peer in peers)
        lines.append(f"  {label} ({hosts}): {runs.runs()} [{verdict}]")
    unread = [peer for peer in range(world) if peer not in answers]
    if unread:
        lines.append(f"  rank{'s' if len(unread) > 1 else ''} {_ranges(unread)}: unknown, the store could not be read "
                     f"({unreadable}); the process serving it (rank 0, or the launcher's agent) has probably stopped")
    lines.append(
        f"Fix: patch every rank the same way. Set {_env.ENV}=1 (and {_env.BACKEND_ENV}, if used) on every node: "
        f"DeepSpeed's multi-node launcher (deepspeed --hostfile) forwards the {_env.PREFIX}* variables to every node "
        f"when it runs with {_env.ENV}=1 itself; with other launchers export them to every node (mpirun -x, "
        f"srun --export, the job script), or put them in .deepspeed_env (NAME=value lines in ~ or the launch "
        f"directory, sent to every node by the deepspeed launcher); or call deepspeed_zeropp.patch() in the training "
        f"script before deepspeed.initialize. Every node needs the same deepspeed_zeropp and the same backend.")
    return "\n".join(lines)


def reset():
    """Forget the last check (tests: the next :func:`ensure` checks again)."""
    global _agreed
    _agreed = None
