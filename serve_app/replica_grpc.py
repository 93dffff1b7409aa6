"""Where a Serve replica of vaultvec's listens for the gRPC calls between deployments.

Serve's throughput mode (cluster/fastpath.py) gives each replica a gRPC server for calls
through DeploymentHandles, bound to every interface (``[::]:0``, ray.serve._private.replica).
Other replicas reach it at the address of its Ray node, so it is bound there instead: loopback
for the local Ray of `vaultvec serve`, the node's own address in a cluster
(docs/security.md, On the machine). It stays behind Ray's token (Serve attaches Ray's
authentication interceptor). Called from a deployment's constructor, which Serve runs before it
starts that server.
"""

from __future__ import annotations

from typing import Any

ALL_INTERFACES = "[::]:0"


def bind_to_node_address() -> None:
    """Make this replica's inter-deployment gRPC server bind its Ray node's address."""
    import ray
    from ray.serve._private import replica

    original = replica.add_port_to_grpc_server
    if getattr(original, "vaultvec_bound", False):
        return
    host = ray.util.get_node_ip_address()
    address = f"[{host}]:0" if ":" in host else f"{host}:0"

    def add_port(server: Any, requested: str) -> int:
        return int(original(server, address if requested == ALL_INTERFACES else requested))

    add_port.vaultvec_bound = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port
