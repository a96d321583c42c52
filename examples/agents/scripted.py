#!/usr/bin/env python3
"""A careful agent for `saga-harness eval`, on the agent API (standard
library only). It does the built-in task the way the harness asks an agent
to work:

- every call with an effect names the step the run gave it (`new_step`);
- an answer that is not final (`unknown`, `not_executed`, an error page,
  no answer at all because the harness went away) is re-sent unchanged,
  under the same step, until it is final;
- the irreversible steps go into one pivot, and the agent waits for the
  person's decision; the harness unwinds a rejected run by itself.

It reads only its environment: SAGA_API_URL, SAGA_TOKEN, SAGA_RUN_LABEL and
SAGA_TASK. A language model would read SAGA_TASK; this script already knows
the one task the built-in scenarios set.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

API = os.environ["SAGA_API_URL"]
TOKEN = os.environ["SAGA_TOKEN"]
LABEL = os.environ["SAGA_RUN_LABEL"]
TASK = os.environ["SAGA_TASK"]

FINAL = {"confirmed", "failed", "rejected"}


def request(method, path, body=None, timeout=30):
    """(status, parsed body); (None, None) when no answer came back."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        API + path,
        data=data,
        method=method,
        headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            text = answer.read().decode()
            return answer.status, (json.loads(text) if text.strip() else None)
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None, None


def until_answered(method, path, body=None, give_up_s=60):
    """Asks again while the harness is away (restarting, say)."""
    deadline = time.time() + give_up_s
    while True:
        status, answer = request(method, path, body)
        if status is not None and status < 500 and answer is not None:
            return status, answer
        if time.time() > deadline:
            sys.exit(f"no answer to {method} {path} for {give_up_s} s")
        time.sleep(0.5)


def log(*words):
    print(*words, flush=True)


def start_run():
    status, answer = until_answered("POST", "/runs", {"label": LABEL, "purpose": TASK})
    if status >= 300:
        sys.exit(f"the run was refused: {status} {answer}")
    return answer["run"]["id"]


def read(run, tool, args):
    status, answer = until_answered("POST", f"/runs/{run}/calls", {"tool": tool, "args": args})
    if status >= 300:
        sys.exit(f"{tool} was refused: {answer}")
    return answer


def act(run, tool, args):
    """One effect at the run's new step, re-sent unchanged until final."""
    _, view = until_answered("GET", f"/runs/{run}")
    step = view["new_step"]
    while True:
        status, answer = until_answered(
            "POST", f"/runs/{run}/calls", {"tool": tool, "args": args, "step": step}
        )
        outcome = answer.get("outcome") if status < 300 else None
        log(f"step {step} {tool}: {status} {outcome or answer.get('code')}")
        if outcome in FINAL:
            return answer
        if status >= 300 and answer.get("code") not in ("step_unresolved", "store_unavailable"):
            sys.exit(f"{tool} was refused: {answer}")
        time.sleep(answer.get("retry_after_s", 0.5) if isinstance(answer, dict) else 0.5)


def main():
    run = start_run()
    read(run, "search_orders", {"customer": "cus_ada"})
    ticket = act(run, "create_ticket", {
        "summary": "Ada's kettle arrived broken",
        "description": "Order ord_1001: the kettle arrived broken; reship KETTLE-2.",
    })
    hold = act(run, "authorize_payment", {
        "customer": "cus_ada", "amount": 900, "currency": "usd",
        "description": "Express shipping for the replacement kettle",
    })
    for answer in (ticket, hold):
        if answer["outcome"] != "confirmed":
            # Nothing to approve: take back what was started.
            log(f"{answer.get('error') or answer['outcome']}: unwinding")
            until_answered("POST", f"/runs/{run}/unwind", {"reason": "could not stage the replacement"})
            return
    act(run, "create_email_draft", {
        "to": "ada@example.com", "subject": "Your replacement kettle",
        "body": "A new kettle is on its way.",
    })
    status, pivot = until_answered("POST", f"/runs/{run}/pivot", {
        "summary": "Reship Ada's kettle, capture the $9.00 express shipping and tell her",
        "commit": [
            {"tool": "reship", "args": {"order_id": "ord_1001", "items": ["KETTLE-2"], "email": "ada@example.com"}},
            {"tool": "capture_payment", "args": {"intent_key": hold["key"], "amount": 900}},
            {"tool": "send_email", "args": {"to": "ada@example.com", "subject": "Your replacement kettle",
                                            "body": "A new kettle is on its way."}},
        ],
    })
    if status >= 300:
        sys.exit(f"the pivot was refused: {pivot}")
    log("pivot proposed; waiting for the lead")
    deadline = time.time() + 75
    while time.time() < deadline:
        _, view = until_answered("GET", f"/runs/{run}")
        state = view["run"]["status"]
        if state in ("COMPLETED", "UNWOUND", "NEEDS_ATTENTION"):
            log("run ended", state)
            return
        time.sleep(0.5)
    sys.exit("the pivot was not decided in time")


if __name__ == "__main__":
    main()
