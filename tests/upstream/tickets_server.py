#!/usr/bin/env python3
"""A ticket desk as an MCP server, written with the official Python SDK,
for the harness's upstream tests. It keeps its own ledger (what really
happened) in a JSON-lines file, so a process that died and was started
again still knows its tickets, and it has no idempotency of its own: a
second create is a second ticket.

Faults come from a JSON file the test writes:
  {"create_ticket": ["drop", "timeout"], "find_ticket": ["hang", "drop"],
   "search_lag_ms": 1500}
each entry used once, in order, by the next call of that tool:
  drop     (create) the ticket is made, then the process dies before
           answering; (find) the process dies before answering
  timeout  the ticket is made, then the answer comes ten seconds later
  hang     (find) the answer comes ten seconds later
and `search_lag_ms` hides a new ticket from find_ticket that long.

Stdio transport: tickets_server.py LEDGER_FILE [FAULTS_FILE].
"""

import asyncio
import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import MCPServer

LEDGER = sys.argv[1]
FAULTS = sys.argv[2] if len(sys.argv) > 2 else ""

server = MCPServer("tickets")


def effects():
    try:
        with open(LEDGER) as ledger:
            return [json.loads(line) for line in ledger if line.strip()]
    except FileNotFoundError:
        return []


def record(action, ticket):
    with open(LEDGER, "a") as ledger:
        ledger.write(json.dumps({"action": action, "ticket": ticket}) + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def tickets():
    """Every ticket as it stands now, by id."""
    found = {}
    for effect in effects():
        ticket = effect["ticket"]
        if effect["action"] == "ticket.created":
            found[ticket["id"]] = dict(ticket)
        elif effect["action"] == "ticket.closed":
            found[ticket["id"]]["status"] = "closed"
    return found


def faults():
    if not FAULTS or not os.path.exists(FAULTS):
        return {}
    with open(FAULTS) as file:
        return json.load(file)


def next_fault(tool):
    armed = faults()
    queue = armed.get(tool, [])
    if not queue:
        return None
    fault = queue.pop(0)
    armed[tool] = queue
    with open(FAULTS, "w") as file:
        json.dump(armed, file)
    return fault


@server.tool(structured_output=True)
async def create_ticket(summary: str, external_id: str) -> dict[str, Any]:
    """Opens a ticket."""
    ticket = {
        "id": f"TCK-{len(tickets()) + 1}",
        "summary": summary,
        "external_id": external_id,
        "status": "open",
        "created_at": time.time(),
    }
    record("ticket.created", ticket)
    fault = next_fault("create_ticket")
    if fault == "drop":
        os._exit(3)
    if fault == "timeout":
        await asyncio.sleep(10)
    return {"ticket": ticket}


@server.tool(structured_output=True)
async def find_ticket(external_id: str) -> dict[str, Any]:
    """Finds the ticket opened with this external id (search lags)."""
    fault = next_fault("find_ticket")
    if fault == "drop":
        os._exit(3)
    if fault == "hang":
        await asyncio.sleep(10)
    lag = faults().get("search_lag_ms", 0) / 1000
    for ticket in tickets().values():
        if ticket["external_id"] == external_id and time.time() - ticket["created_at"] >= lag:
            return {"ticket": ticket}
    return {"ticket": None}


@server.tool(structured_output=True)
async def close_ticket(external_id: str) -> dict[str, Any]:
    """Closes the ticket opened with this external id."""
    for ticket in tickets().values():
        if ticket["external_id"] == external_id:
            if ticket["status"] != "closed":
                record("ticket.closed", ticket)
                ticket["status"] = "closed"
            return {"ticket": ticket}
    raise ValueError(f"no ticket was opened with external id {external_id}")


if __name__ == "__main__":
    server.run("stdio")
