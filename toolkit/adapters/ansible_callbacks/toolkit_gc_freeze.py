"""An Ansible callback plugin of the toolkit's, loaded by ansible-playbook from this directory (the Ansible adapter
names it in the toolkit's own Ansible config); the toolkit never imports it.

ansible-playbook forks a worker for every task on every host, skipped tasks included (a `when:` is evaluated in
the worker). A worker that runs Python's cyclic garbage collector walks every object the controller had when it
forked, and writing their collector headers copies each page it touches (copy-on-write). gc.freeze() moves what is
alive at the start of each play out of the collector's reach: the workers' collections walk only what they made.
Measured in benchmarks/bench_apply.py (docs/apply.md, "How Ansible runs").
"""

from __future__ import annotations

import gc
from typing import Any

from ansible.plugins.callback import CallbackBase  # type: ignore[import-untyped]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "toolkit_gc_freeze"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_play_start(self, play: Any) -> None:
        # Collected first, so that only live objects are frozen (a frozen object is never collected).
        gc.collect()
        gc.freeze()
