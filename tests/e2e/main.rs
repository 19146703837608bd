//! End-to-end tests of the gateway over real loopback sockets: one test binary, one module per
//! feature (after wasmtime's layout). Each test starts its own gateway on 127.0.0.1:0 with
//! simulated GPU servers and talks to it with a plain HTTP client.

mod admin;
mod admin_docs;
mod agents;
mod api;
mod disaggregation;
mod disconnect;
mod engine_events;
mod errors;
mod examples;
mod fallback;
mod fleet;
mod fleet_support;
mod front_door;
mod gates;
mod limits;
mod model;
mod netfaults;
mod policies;
mod reserved;
mod rollout;
mod sandbox;
mod support;
mod telemetry;
mod tls;
mod tools;
mod upstream;
mod worker;
