"""Real control groups for tests: a child process moved into a cgroup this test makes, with a
memory or CPU limit (cgroup v1's per-controller hierarchies or v2's unified one; needs root)."""
import contextlib
import os

import pytest


def _parent(controller):
    """Where a cgroup limiting ``controller`` ("memory" or "cpu") can be made, or None."""
    if os.geteuid() != 0:
        return None
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" - ") for line in f.read().splitlines()]
    for left, right in mounts:
        fstype, _, options = right.split()[:3]
        if fstype == "cgroup" and controller in options.split(","):
            return left.split()[4]
    for left, right in mounts:
        point = left.split()[4]
        control = os.path.join(point, "cgroup.subtree_control")
        if right.split()[0] == "cgroup2" and os.path.exists(control):
            with open(control) as f:
                if controller in f.read().split():
                    return point
    return None


@contextlib.contextmanager
def cgroup(controller, limits):
    """A fresh cgroup of ``controller`` with ``limits`` ({v2 file: value, v1 file: value}; the files
    that exist are written), removed at the end; yields the code a child runs first to enter it."""
    parent = _parent(controller)
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip(f"no writable {controller} cgroup hierarchy (needs root and cgroup v1 {controller} or "
                    f"v2 +{controller})")
    group = os.path.join(parent, f"gpucloud-test-{os.getpid()}")
    os.mkdir(group)
    try:
        for name, value in limits.items():
            if os.path.exists(os.path.join(group, name)):
                with open(os.path.join(group, name), "w") as f:
                    f.write(str(value))
        yield (f"import os\nwith open({os.path.join(group, 'cgroup.procs')!r}, 'w') as f:\n"
               f"    f.write(str(os.getpid()))\n")
    finally:
        os.rmdir(group)
