// The seed incident, driven through the harness's MCP gateway by the
// official TypeScript SDK's client, as an agent framework would: no step
// numbers, reworded retries, and an unwind when the replacement cannot ship.
//
// node end2end/mcp/seed-incident.mjs <MCP URL> <agent token> <run label>
//
// The caller arranges the faults (a 504 after the ticket is created, a blank
// 200 after the charge, the warehouse refusing the kettle) and checks the
// systems' ledgers. This prints one JSON line: what each call answered.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, label] = process.argv.slice(2);
if (!url || !token || !label) {
  console.error("usage: seed-incident.mjs <MCP URL> <agent token> <run label>");
  process.exit(2);
}

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}`, "X-Saga-Run": label } },
});
const client = new Client({ name: "seed-incident", version: "1.0.0" });
await client.connect(transport);

const answers = [];
function expect(condition, what, answer) {
  if (!condition) {
    throw new Error(`${what}: ${JSON.stringify(answer)}`);
  }
}

async function call(name, args) {
  const answer = await client.callTool({ name, arguments: args });
  const outcome = answer.structuredContent?.outcome ?? null;
  answers.push({ tool: name, outcome, isError: answer.isError ?? false, step: answer.structuredContent?.step ?? null });
  return answer;
}

const listed = await client.listTools();
const names = listed.tools.map((tool) => tool.name);
for (const name of ["search_orders", "create_ticket", "charge_card", "reship", "saga_run", "saga_unwind"]) {
  expect(names.includes(name), `${name} is listed`, names);
}
const charge = listed.tools.find((tool) => tool.name === "charge_card");
expect(charge.annotations?.idempotentHint === true, "charge_card is idempotent", charge.annotations);

const orders = await call("search_orders", { customer: "cus_ada" });
expect(orders.structuredContent?.outcome === "confirmed", "the orders are read", orders);

const ticket = { summary: "Ada's kettle arrived broken", description: "Order ord_1001; customer asks for a replacement." };
const lost = await call("create_ticket", ticket);
expect(lost.structuredContent?.outcome === "unknown" && !lost.isError, "the 504 is unknown, not an error", lost);
const found = await call("create_ticket", { summary: "Kettle broken on arrival (Ada)", description: ticket.description });
expect(found.structuredContent?.outcome === "confirmed", "the reworded retry reads the ticket", found);
expect(found.structuredContent?.step === lost.structuredContent?.step, "the retry is the same step", found);

const charged = { customer: "cus_ada", amount: 900, currency: "usd", email: "ada@example.com", receipt: false, description: "Express shipping for the replacement kettle" };
const blank = await call("charge_card", charged);
expect(blank.structuredContent?.outcome === "unknown", "a blank 200 is unknown", blank);
const settled = await call("charge_card", { ...charged, description: "Express shipping (replacement kettle)" });
expect(settled.structuredContent?.outcome === "confirmed", "the retry reads the charge", settled);

const refused = await call("reship", { order_id: "ord_1001", items: ["KETTLE-2"], email: "ada@example.com" });
expect(refused.isError === true && refused.structuredContent?.outcome === "failed", "the warehouse refuses", refused);

const unwound = await call("saga_unwind", { reason: "the replacement kettle is out of stock" });
expect(!unwound.isError, "the run unwinds", unwound);
const log = await call("saga_run", {});
const runStatus = log.structuredContent?.run?.status;

await client.close();
console.log(JSON.stringify({ protocol: transport.protocolVersion ?? null, runStatus, answers }));
