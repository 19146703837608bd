"""Values for unit-testing a policy's logic without Wasm: servers shaped like the WIT record."""

from dataclasses import dataclass


@dataclass
class Server:
    """The WIT `server` record's fields, as componentize-py names them."""

    id: str
    role: str = "both"
    healthy: bool = True
    weight: int = 1
    in_flight: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 1024


def server(server_id, **fields):
    """A healthy server of weight 1 taking whole requests with nothing in flight, `fields`
    overriding (`role="decode"` or `"prefill"` for a disaggregated fleet)."""
    return Server(id=server_id, **fields)
