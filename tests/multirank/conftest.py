"""The multi-rank files the README's test command leaves out (``-m "not slow"``): each costs a minute or more on a
2-core machine and checks what the quicker files already touch from another side (LoRA with checkpoints and hpZ
at 4 ranks, one packet per fetch, agreement between ranks, the simulate smoke). ``.ci/run`` runs them after the
README's command (``-m slow``)."""
import pytest

SLOW = ("test_lora_hpz.py", "test_fetch_packets.py", "test_agreement.py", "test_simulate.py")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in SLOW and item.path.parent.name == "multirank":
            item.add_marker(pytest.mark.slow)
