"""A free TCP port for a server a test starts in another process (a gloo rendezvous, Prometheus)."""
import random
import socket


def free_port():
    """A port free on every address, below the kernel's ephemeral range. A port bind(0) handed out
    is ephemeral: between the check and the server binding it (seconds later, after mpirun started
    its daemons) an outgoing connection can take it, and a gloo rendezvous failed so in CI."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port below the ephemeral range")
