"""What confinement a child process of the verifier finds itself in (docs/python-candidates.md):
the one check that both programs running a Python candidate's code make of themselves before
they load it, the case runner (verifier/src/python_runner.py) and the model-level harness
(python/kernelize_verifier/model_level.py). The verifier embeds this file and writes it beside
each child as `kernelize_confinement.py` (`verifier::python::CONFINEMENT_SOURCE`); each loads it
from that path. Standard library only; importing it changes nothing.
"""


def network_isolation():
    """What network this process can reach, judged from the interfaces of its own network
    namespace (asked of the kernel: /sys/class/net shows the namespace sysfs was mounted in)."""
    import socket
    try:
        ifaces = sorted(name for _, name in socket.if_nameindex())
    except OSError as e:
        return f"unknown (cannot list the network interfaces: {e})"
    if ifaces in (["lo"], []):
        return "isolated: a network namespace of its own, no interface but lo"
    return "NOT isolated: interfaces " + ", ".join(ifaces)


def isolation(directory):
    """The isolation lines a report carries: the network (first: what a caller that requires
    isolation tests), `directory` (the working directory, as the caller describes it), and the
    memory limit where the platform has one."""
    lines = [network_isolation(), directory]
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
        lines.append("memory: RLIMIT_DATA " + ("unlimited" if soft == resource.RLIM_INFINITY
                                               else f"{soft >> 20} MiB"))
    except Exception:  # noqa: BLE001 - no resource module or no limit to read: said by omission
        pass
    return lines

