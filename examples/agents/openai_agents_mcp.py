#!/usr/bin/env python3
"""An agent written with the OpenAI Agents SDK that reaches its tools
through the harness's MCP gateway, for `saga-harness eval`.

Everything is the SDK's own: the Agent, the Runner's loop of model turns
and tool calls, and the MCP client (`MCPServerStreamableHttp`) that lists
the harness's tools and calls them. Only the model is scripted, so the
example runs without a network or a key: `ScriptedModel` answers each turn
the way a well-instructed model does, from the tool outputs the Runner
hands it. Swap it for `model="gpt-4.1"` (and an OPENAI_API_KEY) to run a
real one; the instructions say what a real one needs to know.

Over MCP the agent names no step numbers: the gateway keeps the run's
steps, and calling a tool again after an answer that is not final reads
that same step's outcome instead of acting twice.

Reads SAGA_MCP_URL, SAGA_TOKEN and SAGA_TASK.
"""

import asyncio
import json
import os

from agents import Agent, ModelSettings, Runner, SQLiteSession, set_tracing_disabled
from agents.items import ModelResponse
from agents.mcp import MCPServerStreamableHttp
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

INSTRUCTIONS = """You handle one support task through tools that have real
effects. A call whose outcome is `unknown` or `not_executed`, or that fails
to answer, is called again with the same arguments until the outcome is
final; never reword it into a new effect. Irreversible calls (reship,
capture_payment, send_email) go into one saga_propose_pivot for a person
to approve; call saga_propose_pivot again to read the decision."""

FINAL = {"confirmed", "failed", "rejected"}
DECIDED = {"approved", "rejected", "expired"}


def parse(output):
    """A tool output as the model reads it: the structured answer, or the
    words of a refusal or an error (content parts, which the Runner passes
    on as a list)."""
    if isinstance(output, list):
        text = " ".join(str(part.get("text", "")) for part in output if isinstance(part, dict))
    elif isinstance(output, dict):
        text = str(output.get("text", ""))
    else:
        try:
            value = json.loads(output)
            if isinstance(value, dict):
                return value
        except (TypeError, ValueError):
            pass
        text = str(output)
    # A final "no" comes as an error whose words begin with the outcome
    # ("failed: Your card was declined").
    word = text.split(":", 1)[0].strip()
    return {"text": text, "outcome": word} if word in FINAL else {"text": text}


def plan(hold_key):
    """The task's calls, in order."""
    return [
        ("search_orders", {"customer": "cus_ada"}),
        ("create_ticket", {
            "summary": "Ada's kettle arrived broken",
            "description": "Order ord_1001: the kettle arrived broken; reship KETTLE-2.",
        }),
        ("authorize_payment", {
            "customer": "cus_ada", "amount": 900, "currency": "usd",
            "description": "Express shipping for the replacement kettle",
        }),
        ("create_email_draft", {
            "to": "ada@example.com", "subject": "Your replacement kettle",
            "body": "A new kettle is on its way.",
        }),
        ("saga_propose_pivot", {
            "summary": "Reship Ada's kettle, capture the $9.00 express shipping and tell her",
            "commit": [
                {"tool": "reship", "args": {"order_id": "ord_1001", "items": ["KETTLE-2"],
                                            "email": "ada@example.com"}},
                {"tool": "capture_payment", "args": {"intent_key": hold_key, "amount": 900}},
                {"tool": "send_email", "args": {"to": "ada@example.com",
                                                "subject": "Your replacement kettle",
                                                "body": "A new kettle is on its way."}},
            ],
        }),
    ]


def finished(name, answer):
    """Whether this answer ends the call, as the instructions say."""
    if name == "search_orders":
        return "text" not in answer or not answer["text"].startswith("refused")
    if name == "saga_propose_pivot":
        text = answer.get("text", "")
        return answer.get("outcome") in DECIDED or text.startswith(("rejected", "expired"))
    return answer.get("outcome") in FINAL


class ScriptedModel(Model):
    """Stands in for the language model: each turn, one tool call or the
    final answer, decided from the conversation so far."""

    def __init__(self):
        self.turn = 0

    async def get_response(self, system_instructions, input, model_settings, tools,
                           output_schema, handoffs, tracing, *, previous_response_id=None,
                           conversation_id=None, prompt=None):
        self.turn += 1
        items = input if isinstance(input, list) else []
        calls = {}
        answered = []  # (tool, answer) in order
        for item in items:
            item = item if isinstance(item, dict) else item.model_dump()
            if item.get("type") == "function_call":
                calls[item["call_id"]] = item["name"]
            elif item.get("type") == "function_call_output":
                name = calls.get(item["call_id"], "")
                answered.append((name, parse(item.get("output"))))
        done = {name: answer for name, answer in answered if finished(name, answer)}
        hold = done.get("authorize_payment", {})
        for name, args in plan(hold.get("key")):
            if name in done:
                if done[name].get("outcome") == "failed":
                    return self.call("saga_unwind", {"reason": f"{name} failed"}) \
                        if not any(n == "saga_unwind" for n, _ in answered) else self.say("Unwound.")
                continue
            if answered and answered[-1][0] == name:
                # Not final yet: the same call again, after a pause.
                await asyncio.sleep(0.5 if name != "saga_propose_pivot" else 1.0)
            return self.call(name, args)
        return self.say("Done: " + json.dumps(done.get("saga_propose_pivot", {}))[:200])

    def call(self, name, args):
        call = ResponseFunctionToolCall(
            type="function_call", call_id=f"call_{self.turn}", name=name,
            arguments=json.dumps(args), id=f"fc_{self.turn}", status="completed",
        )
        print(f"turn {self.turn}: {name}", flush=True)
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def say(self, text):
        message = ResponseOutputMessage(
            id=f"msg_{self.turn}", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        print(text, flush=True)
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the scripted model answers whole turns")


async def main():
    set_tracing_disabled(True)
    # The conversation outlives a dropped connection: when the harness goes
    # away mid-call (a restart), the agent connects again and carries on
    # from what the session holds; the call in flight is made again, and
    # the gateway answers it from the same step.
    session = SQLiteSession("eval")
    model = ScriptedModel()
    say = os.environ["SAGA_TASK"]
    for attempt in range(10):
        try:
            async with MCPServerStreamableHttp(
                params={
                    "url": os.environ["SAGA_MCP_URL"],
                    "headers": {"Authorization": "Bearer " + os.environ["SAGA_TOKEN"]},
                    "timeout": 30,
                },
                name="support",
                client_session_timeout_seconds=30,
                use_structured_content=True,
            ) as support:
                agent = Agent(
                    name="support agent",
                    instructions=INSTRUCTIONS,
                    model=model,
                    model_settings=ModelSettings(),
                    mcp_servers=[support],
                )
                result = await Runner.run(agent, say, max_turns=120, session=session)
                print("final:", result.final_output, flush=True)
                return
        except Exception as error:  # the SDK's MCP errors, connection errors
            print(f"the tools went away ({type(error).__name__}: {error}); connecting again",
                  flush=True)
            say = "The connection to the tools dropped. Carry on with the task."
            await asyncio.sleep(1 + attempt)
    raise SystemExit("the tools did not come back")


if __name__ == "__main__":
    asyncio.run(main())
