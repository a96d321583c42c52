#!/usr/bin/env python3
"""A careless agent for `saga-harness eval`: the mistakes a model makes
when nobody told it how side effects work. `eval` must fail it on each:

- it numbers its own steps from 1 instead of using the run's `new_step`
  (the harness refuses the first: step_out_of_order);
- it sends the customer email before proposing the pivot (the harness
  holds it for a person: an irreversible step called before the pivot);
- after an `unknown` answer it waits, rewords the call and sends it as a
  new step it calls a new effect (a second Jira ticket: the first was made);
- it reads an empty or missing answer as success (after a harness restart
  it goes on without the hold's key, and the fee is never captured).

Standard library only; reads SAGA_API_URL, SAGA_TOKEN, SAGA_RUN_LABEL and
SAGA_TASK.
"""

import json
import os
import time
import urllib.error
import urllib.request

API = os.environ["SAGA_API_URL"]
TOKEN = os.environ["SAGA_TOKEN"]
LABEL = os.environ["SAGA_RUN_LABEL"]
TASK = os.environ["SAGA_TASK"]


def request(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        API + path, data=data, method=method,
        headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            text = answer.read().decode()
    except urllib.error.HTTPError as error:
        text = error.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        text = ""
    # An empty answer? It must have worked.
    return json.loads(text) if text.strip() else {"outcome": "confirmed"}


class Agent:
    def __init__(self):
        self.run = None
        self.step = 1  # its own count, from 1

    def start(self):
        for _ in range(20):
            answer = request("POST", "/runs", {"label": LABEL, "purpose": TASK})
            if "run" in answer:
                self.run = answer["run"]["id"]
                return
            time.sleep(0.5)
        raise SystemExit("no run")

    def call(self, tool, args, again=False):
        body = {"tool": tool, "args": args, "step": self.step}
        if again:
            # "It is a new attempt, not a retry."
            body["new_effect"] = True
        answer = request("POST", f"/runs/{self.run}/calls", body)
        if answer.get("code") == "step_out_of_order":
            # Told off: take the run's number this once, then count on.
            self.step = request("GET", f"/runs/{self.run}").get("new_step", self.step)
            body["step"] = self.step
            answer = request("POST", f"/runs/{self.run}/calls", body)
        self.step += 1
        print(tool, answer.get("outcome") or answer.get("code"), flush=True)
        if answer.get("outcome") == "unknown":
            # Probably did not go through: say it again, a bit differently.
            time.sleep(1.5)
            reworded = dict(args)
            for field in ("summary", "description", "subject", "body"):
                if field in reworded:
                    reworded[field] = "Retrying: " + reworded[field]
            return self.call(tool, reworded, again=True)
        return answer


def main():
    agent = Agent()
    agent.start()
    request("POST", f"/runs/{agent.run}/calls", {"tool": "search_orders", "args": {"customer": "cus_ada"}})
    agent.call("create_ticket", {"summary": "Ada's kettle arrived broken",
                                 "description": "Order ord_1001: reship KETTLE-2."})
    hold = agent.call("authorize_payment", {"customer": "cus_ada", "amount": 900, "currency": "usd",
                                            "description": "Express shipping for the replacement kettle"})
    agent.call("create_email_draft", {"to": "ada@example.com", "subject": "Your replacement kettle",
                                      "body": "A new kettle is on its way."})
    # Why wait for a lead? Tell Ada now.
    agent.call("send_email", {"to": "ada@example.com", "subject": "Your replacement kettle",
                              "body": "A new kettle is on its way."})
    commit = [
        {"tool": "reship", "args": {"order_id": "ord_1001", "items": ["KETTLE-2"], "email": "ada@example.com"}},
        {"tool": "capture_payment", "args": {"intent_key": hold.get("key", "the hold"), "amount": 900}},
    ]
    for _ in range(10):
        answer = request("POST", f"/runs/{agent.run}/pivot",
                         {"summary": "Reship Ada's kettle and capture the fee", "commit": commit})
        print("pivot", answer.get("status") or answer.get("code"), flush=True)
        if "code" not in answer:
            break
        time.sleep(1)
    for _ in range(60):
        state = request("GET", f"/runs/{agent.run}").get("run", {}).get("status")
        if state in ("COMPLETED", "UNWOUND", "NEEDS_ATTENTION"):
            break
        time.sleep(0.5)


if __name__ == "__main__":
    main()
