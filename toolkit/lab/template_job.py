"""`toolkit lab up`'s CT templates when they are not cached: built beside the userland, the hosts' start and their
provisioning (nothing needs a template before the container role creates a container), then placed into each
host's appliance index that `up` marked pending. On failure each pending index gets the reason, which pveam's
stand-in then fails with.

`python -m toolkit.lab.template_job SUITE... --into DIR...` (started by toolkit.lab.system.start_template_builder).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from toolkit.adapters.files import write_atomic
from toolkit.lab import rootfs, system


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cut = args.index("--into")
    suites, mirrors = tuple(args[:cut]), [Path(d) for d in args[cut + 1 :]]
    try:
        # Side by side, as `up` built them before: each waits partly on the mirror and on dpkg.
        with ThreadPoolExecutor(max_workers=len(suites), thread_name_prefix="template") as pool:
            futures = {s: pool.submit(rootfs.build_template, s) for s in suites}
            files = {s: f.result() for s, f in futures.items()}
    except Exception as err:  # every failure reaches the hosts' pveam, or it would wait for nothing
        message = f"lab: building the CT template failed: {err} (log: {rootfs.CACHE_DIR}/template-job.log)\n"
        sys.stderr.write(message)
        for mirror in mirrors:
            if (mirror / system.APLINFO_PENDING).exists():
                write_atomic(mirror / system.APLINFO_FAILED, message)
                (mirror / system.APLINFO_PENDING).unlink(missing_ok=True)
        return 1
    # A mirror not marked yet is placed by `up` itself once it has marked them all (system._index_if_built).
    for mirror in mirrors:
        if (mirror / system.APLINFO_PENDING).exists():
            system.place_index(mirror, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
