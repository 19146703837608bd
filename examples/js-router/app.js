// js-router: a Ringmaster router in JavaScript (componentize-js). The decision itself lives in
// policy.js, which imports nothing generated, so `node --test` tests it without Wasm; this
// file only asks the host and answers.
import { servers as listServers, prefixMatches, prefillBacklog } from "ringmaster:policy/cluster@0.3.0";
import { candidates } from "ringmaster:policy/ring@0.3.0";
import { choose } from "./policy.js";

export function route(req) {
  const servers = listServers();
  const hashes = req.prefixHashCount();
  const matches = hashes > 0 ? prefixMatches() : [];
  const order = candidates(req.routingKey(), servers.length);
  const server = choose(servers, matches, prefillBacklog(), req.promptTokens(), hashes, order);
  if (server === null) {
    return { tag: "reject", val: "no healthy GPU server" };
  }
  return { tag: "route", val: server.id };
}
