//! The three kinds of policy — [`RouterPolicy`], [`AdmissionPolicy`], [`SafetyPolicy`], one
//! [`Loaded`] handle type over the three worlds — and how each is loaded: the engine's common
//! pipeline, then probe calls on synthetic inputs that must succeed before the handle is
//! returned.
//!
//! A handle is one loaded version: cheap to clone, safe to call from many threads at once
//! (each call takes its own warm instance). Dropping the last clone frees its instances.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::{ComponentExportIndex, Instance, Resource, TypedFunc};

use crate::MAX_ANSWER_TEXT_BYTES;
use crate::contract::{Version, World};
use crate::engine::PolicyEngine;
use crate::error::{FaultCounts, PolicyError, PolicyFault};
use crate::host::{CallCx, StoreData};
use crate::imports::{RequestRep, request_borrow};
use crate::instance::Core;
use crate::probe::{self, PROBE_SERVERS, ProbeCluster};
use crate::state::{StateMode, StateUsage};
use crate::types::{
    AdmissionLoad, AdmissionVerdict, Outcome, PolicyInfo, PolicyRequest, RequestV0_1,
    RouteDecision, RouterHost, SafetyVerdict, WitDecision, WitDecisionV3, WitVerdict,
};

/// Longest part of a guest's answer quoted in a fault message.
const QUOTE_LIMIT: usize = 64;

/// The `router` world, as the type a [`Loaded`] handle is of.
#[derive(Debug)]
pub struct RouterWorld;
/// The `admission` world, as the type a [`Loaded`] handle is of.
#[derive(Debug)]
pub struct AdmissionWorld;
/// The `safety-filter` world, as the type a [`Loaded`] handle is of.
#[derive(Debug)]
pub struct SafetyWorld;

/// One loaded policy version of world `W`. Clone it freely; calls may run on many threads at
/// once. What every kind has is here; what each kind is asked is on its alias.
#[allow(private_bounds)] // `World` is the engine's own; the worlds themselves are public.
pub struct Loaded<W: World> {
    core: Arc<Core<W>>,
}

/// A loaded router policy version.
pub type RouterPolicy = Loaded<RouterWorld>;
/// A loaded admission policy version.
pub type AdmissionPolicy = Loaded<AdmissionWorld>;
/// A loaded safety-filter version.
pub type SafetyPolicy = Loaded<SafetyWorld>;

#[allow(private_bounds)]
impl<W: World> Clone for Loaded<W> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
        }
    }
}

#[allow(private_bounds)]
impl<W: World> Loaded<W> {
    /// What was loaded.
    pub fn info(&self) -> &PolicyInfo {
        &self.core.info
    }

    /// Faults of this version so far, by kind.
    pub fn faults(&self) -> FaultCounts {
        self.core.faults()
    }

    /// One fresh instantiation's time, outside the warm pool (`ringmaster policy check`).
    pub fn time_instantiation(&self) -> Result<std::time::Duration, PolicyFault> {
        self.core.time_instantiation()
    }

    /// The contract version it was built against (`0.1.0`, `0.2.0` or `0.3.0`).
    pub fn contract(&self) -> &'static str {
        self.core.version.as_str()
    }
}

#[allow(private_bounds)]
impl<W: World> fmt::Debug for Loaded<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

/// `route` in each contract version: 0.1.0 copies the request record in, 0.2.0 lends a
/// borrow of the request resource.
#[derive(Clone, Copy)]
pub(crate) enum RouteFn {
    V0_1(TypedFunc<(&'static RequestV0_1<'static>,), (WitDecision,)>),
    V0_2(TypedFunc<(Resource<RequestRep>,), (WitDecision,)>),
    V0_3(TypedFunc<(Resource<RequestRep>,), (WitDecisionV3,)>),
}

type ObserveFn = TypedFunc<(&'static Outcome,), ()>;

/// A router's exports: `route`, and `observe` for a 0.2.0 learning router.
#[derive(Clone, Copy)]
pub(crate) struct RouterExports {
    route: RouteFn,
    observe: Option<ObserveFn>,
}

/// `admit` in each contract version.
#[derive(Clone, Copy)]
pub(crate) enum AdmitFn {
    V0_1(TypedFunc<(&'static RequestV0_1<'static>, AdmissionLoad), (WitVerdict,)>),
    /// 0.2.0 and 0.3.0 (`admit` is the same in both).
    V0_2(TypedFunc<(Resource<RequestRep>, AdmissionLoad), (WitVerdict,)>),
}

type CheckInputFn = TypedFunc<(&'static str,), (SafetyVerdict,)>;
type CheckOutputFn = TypedFunc<(&'static str, bool), (SafetyVerdict,)>;

impl World for RouterWorld {
    const NAME: &'static str = "router";
    const EXPORTS: &'static [&'static str] = &["route"];
    const OPTIONAL_EXPORTS: &'static [&'static str] = &["observe"];
    const IMPORTS: &'static [&'static str] = &[
        "ringmaster:policy/ring",
        "ringmaster:policy/cluster",
        "ringmaster:policy/state",
        "ringmaster:policy/log",
        "ringmaster:policy/metrics",
        "ringmaster:policy/config",
    ];
    type Exports = RouterExports;

    fn exports(
        instance: &Instance,
        store: &mut Store<StoreData>,
        version: Version,
        indices: &[ComponentExportIndex],
        optional: &[bool],
    ) -> wasmtime::Result<RouterExports> {
        let route = match version {
            Version::V0_1 => RouteFn::V0_1(instance.get_typed_func(&mut *store, indices[0])?),
            Version::V0_2 => RouteFn::V0_2(instance.get_typed_func(&mut *store, indices[0])?),
            Version::V0_3 => RouteFn::V0_3(instance.get_typed_func(&mut *store, indices[0])?),
        };
        let observe = match optional.first() {
            Some(true) => Some(instance.get_typed_func(&mut *store, indices[1])?),
            _ => None,
        };
        Ok(RouterExports { route, observe })
    }
}

impl World for AdmissionWorld {
    const NAME: &'static str = "admission";
    const EXPORTS: &'static [&'static str] = &["admit"];
    const IMPORTS: &'static [&'static str] = &[
        "ringmaster:policy/cluster",
        "ringmaster:policy/state",
        "ringmaster:policy/log",
        "ringmaster:policy/metrics",
        "ringmaster:policy/config",
    ];
    type Exports = AdmitFn;

    fn exports(
        instance: &Instance,
        store: &mut Store<StoreData>,
        version: Version,
        indices: &[ComponentExportIndex],
        _optional: &[bool],
    ) -> wasmtime::Result<AdmitFn> {
        Ok(match version {
            Version::V0_1 => AdmitFn::V0_1(instance.get_typed_func(store, indices[0])?),
            Version::V0_2 | Version::V0_3 => {
                AdmitFn::V0_2(instance.get_typed_func(store, indices[0])?)
            }
        })
    }
}

impl World for SafetyWorld {
    const NAME: &'static str = "safety-filter";
    const EXPORTS: &'static [&'static str] = &["check-input", "check-output"];
    const IMPORTS: &'static [&'static str] = &[
        "ringmaster:policy/state",
        "ringmaster:policy/log",
        "ringmaster:policy/metrics",
        "ringmaster:policy/config",
    ];
    type Exports = (CheckInputFn, CheckOutputFn);

    fn exports(
        instance: &Instance,
        store: &mut Store<StoreData>,
        _version: Version,
        indices: &[ComponentExportIndex],
        _optional: &[bool],
    ) -> wasmtime::Result<Self::Exports> {
        let input = instance.get_typed_func(&mut *store, indices[0])?;
        let output = instance.get_typed_func(&mut *store, indices[1])?;
        Ok((input, output))
    }
}

/// Whether a load runs the probe calls (only tests skip them, to reach a faulty policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    Run,
    #[cfg_attr(not(test), allow(dead_code))]
    Skip,
}

impl PolicyEngine {
    /// Loads a router policy: compile (cached) → check it targets the `router` world → link →
    /// instantiate → probe `route` on synthetic requests against a four-server cluster, each
    /// answer having to be `route` to one of those servers or `reject`.
    ///
    /// `config` is what the policy reads through the `config` import.
    pub fn load_router(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
    ) -> Result<RouterPolicy, PolicyError> {
        self.load_router_with_state(name, bytes, config, StateMode::Keep)
    }

    /// [`load_router`](Self::load_router), saying which `state` store the new version gets:
    /// the one of the version it replaces under `name`, or a fresh one.
    pub fn load_router_with_state(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
        state: StateMode,
    ) -> Result<RouterPolicy, PolicyError> {
        self.load_router_opts(name, bytes, config, state, Probe::Run)
    }

    #[cfg(test)]
    pub(crate) fn load_router_with(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
        probe: Probe,
    ) -> Result<RouterPolicy, PolicyError> {
        self.load_router_opts(name, bytes, config, StateMode::Keep, probe)
    }

    fn load_router_opts(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
        state: StateMode,
        probe: Probe,
    ) -> Result<RouterPolicy, PolicyError> {
        let policy = RouterPolicy {
            core: self.load::<RouterWorld>(name, bytes, config, state)?,
        };
        if probe == Probe::Run {
            for (i, (what, request)) in probe::requests().iter().enumerate() {
                let cluster = ProbeCluster::new(request);
                match policy.decide(&cluster, request, false) {
                    Ok(RouteDecision::Route(id) | RouteDecision::Pair { decode: id, .. }) => {
                        debug_assert!(PROBE_SERVERS.contains(&id.as_str()))
                    }
                    Ok(RouteDecision::Reject(_)) => {}
                    Err(fault) => {
                        return Err(self.probe_failed(
                            name,
                            i,
                            what,
                            &fault,
                            "route to one of `probe-0`..`probe-3` (with a prefill server `probe-p0` or `probe-p1`, for a pair) or reject",
                        ));
                    }
                }
            }
        }
        Ok(policy)
    }

    /// Loads an admission policy: the same pipeline as [`load_router`](Self::load_router),
    /// probing `admit` with synthetic requests under an idle, a saturated and an empty cluster.
    pub fn load_admission(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
    ) -> Result<AdmissionPolicy, PolicyError> {
        self.load_admission_with(name, bytes, config, Probe::Run)
    }

    pub(crate) fn load_admission_with(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
        probe: Probe,
    ) -> Result<AdmissionPolicy, PolicyError> {
        let policy = AdmissionPolicy {
            core: self.load::<AdmissionWorld>(name, bytes, config, StateMode::Keep)?,
        };
        if probe == Probe::Run {
            let requests = probe::requests();
            for (i, (what, load)) in probe::loads().iter().enumerate() {
                let request = &requests[i % requests.len()].1;
                let cluster = ProbeCluster::new(request);
                if let Err(fault) = policy.decide(&cluster, request, load, false) {
                    return Err(self.probe_failed(
                        name,
                        i,
                        what,
                        &fault,
                        "answer accept, queue or reject",
                    ));
                }
            }
        }
        Ok(policy)
    }

    /// Loads a safety filter: the same pipeline, probing `check-input` and `check-output`
    /// with a few ordinary texts.
    pub fn load_safety(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
    ) -> Result<SafetyPolicy, PolicyError> {
        self.load_safety_with(name, bytes, config, Probe::Run)
    }

    pub(crate) fn load_safety_with(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
        probe: Probe,
    ) -> Result<SafetyPolicy, PolicyError> {
        let policy = SafetyPolicy {
            core: self.load::<SafetyWorld>(name, bytes, config, StateMode::Keep)?,
        };
        if probe == Probe::Run {
            for (i, (what, text, output, last)) in probe::texts().into_iter().enumerate() {
                let answer = if output {
                    policy.check(Text::Output(text, last), false)
                } else {
                    policy.check(Text::Input(text), false)
                };
                if let Err(fault) = answer {
                    return Err(self.probe_failed(name, i, what, &fault, "answer allow or block"));
                }
            }
        }
        Ok(policy)
    }

    fn probe_failed(
        &self,
        name: &str,
        i: usize,
        what: &str,
        fault: &PolicyFault,
        expected: &str,
    ) -> PolicyError {
        let why = match fault {
            PolicyFault::InvalidAnswer(answer) => format!("{answer}; it must {expected}"),
            // Probe calls run under the instantiate deadline (see `Budget::Probe`).
            PolicyFault::Deadline if self.config().fuel.is_none() => format!(
                "it ran past the {:?} probe deadline (the instantiate deadline; an endless loop?)",
                self.config().instantiate_deadline
            ),
            other => self.explain(other, false),
        };
        PolicyError::ProbeFailed(format!(
            "`{name}` failed probe call {} of the load checks ({what}): {}: {why}",
            i + 1,
            fault.kind()
        ))
    }
}

impl RouterPolicy {
    /// Asks the policy where `request` goes. `host` answers the policy's `ring` and `cluster`
    /// imports during the call.
    ///
    /// A `route(id)` answer is checked with [`RouterHost::routable`]: a server that is not in
    /// the pool or not healthy is a [`PolicyFault::InvalidAnswer`]. Every fault is counted in
    /// [`faults`](Self::faults); none of them leaves the policy unusable.
    pub fn route(
        &self,
        host: &dyn RouterHost,
        request: &PolicyRequest,
    ) -> Result<RouteDecision, PolicyFault> {
        self.decide(host, request, true)
    }

    fn decide(
        &self,
        host: &dyn RouterHost,
        request: &PolicyRequest,
        counting: bool,
    ) -> Result<RouteDecision, PolicyFault> {
        let cx = CallCx {
            host: Some(host),
            request: Some(request),
            request_id: &request.id,
            counting,
        };
        let decision = self.core.call(cx, |store, exports| match exports.route {
            RouteFn::V0_1(route) => {
                let route: TypedFunc<(&RequestV0_1<'_>,), (WitDecision,)> = route;
                Ok(route.call(store, (&RequestV0_1::from(request),))?.0.into())
            }
            RouteFn::V0_2(route) => Ok(route.call(store, (request_borrow(),))?.0.into()),
            RouteFn::V0_3(route) => Ok(route.call(store, (request_borrow(),))?.0.into()),
        })?;
        let invalid = match &decision {
            RouteDecision::Route(id) if !host.routable(id) => Some(format!(
                "it answered route({}), which is not a healthy server in the pool",
                quote(id)
            )),
            RouteDecision::Pair { decode, .. } if !host.routable(decode) => Some(format!(
                "it answered a pair decoding on {}, which is not a healthy server a request \
                 may be routed to",
                quote(decode)
            )),
            RouteDecision::Pair {
                prefill: Some(prefill),
                ..
            } if !host.prefill_routable(prefill) => Some(format!(
                "it answered a pair prefilling on {}, which is not a healthy prefill server",
                quote(prefill)
            )),
            _ => None,
        };
        if let Some(why) = invalid {
            return Err(self.core.fault(PolicyFault::InvalidAnswer(why)));
        }
        Ok(match decision {
            RouteDecision::Reject(reason) => RouteDecision::Reject(bounded(reason)),
            RouteDecision::Pair {
                decode,
                prefill,
                reason,
            } => RouteDecision::Pair {
                decode,
                prefill,
                reason: bounded(reason),
            },
            route => route,
        })
    }

    /// Whether it is a learning router (0.2.0, exporting `observe`).
    pub fn learns(&self) -> bool {
        self.core.optional.first().copied().unwrap_or(false)
    }

    /// Hands a learning router what happened to a request it decided; a no-op (`Ok`) for a
    /// router that does not learn. During the call `ring` and `cluster` answer as an empty
    /// pool would: the request is over, and the pool has moved on. A fault is counted like a
    /// routing fault and leaves the policy usable.
    pub fn observe(&self, outcome: &Outcome) -> Result<(), PolicyFault> {
        if !self.learns() {
            return Ok(());
        }
        let cx = CallCx {
            host: None,
            request: None,
            request_id: &outcome.request_id,
            counting: true,
        };
        self.core.call(cx, |store, exports| match exports.observe {
            Some(observe) => {
                let observe: TypedFunc<(&Outcome,), ()> = observe;
                observe.call(store, (outcome,))
            }
            None => Ok(()),
        })
    }

    /// How full its `state` store is.
    pub fn state_usage(&self) -> StateUsage {
        self.core.state_usage()
    }

    /// In fuel mode, the fuel the last successful call burned (`ringmaster policy check`).
    pub fn last_call_fuel(&self) -> Option<u64> {
        self.core.last_call_fuel()
    }

    #[cfg(test)]
    pub(crate) fn core(&self) -> &Core<RouterWorld> {
        &self.core
    }
}

impl AdmissionPolicy {
    /// Asks the policy whether `request` runs now, waits or is refused under `load`. `host`
    /// answers its `cluster` import.
    pub fn admit(
        &self,
        host: &dyn RouterHost,
        request: &PolicyRequest,
        load: &AdmissionLoad,
    ) -> Result<AdmissionVerdict, PolicyFault> {
        self.decide(host, request, load, true)
    }

    fn decide(
        &self,
        host: &dyn RouterHost,
        request: &PolicyRequest,
        load: &AdmissionLoad,
        counting: bool,
    ) -> Result<AdmissionVerdict, PolicyFault> {
        let cx = CallCx {
            host: Some(host),
            request: Some(request),
            request_id: &request.id,
            counting,
        };
        let verdict = self.core.call(cx, |store, admit| match admit {
            AdmitFn::V0_1(admit) => {
                let admit: TypedFunc<(&RequestV0_1<'_>, AdmissionLoad), (WitVerdict,)> = admit;
                Ok(admit.call(store, (&RequestV0_1::from(request), *load))?.0)
            }
            AdmitFn::V0_2(admit) => Ok(admit.call(store, (request_borrow(), *load))?.0),
        })?;
        Ok(match verdict.into() {
            AdmissionVerdict::Reject {
                reason,
                retry_after_ms,
            } => AdmissionVerdict::Reject {
                reason: bounded(reason),
                retry_after_ms,
            },
            verdict => verdict,
        })
    }
}

enum Text<'a> {
    Input(&'a str),
    Output(&'a str, bool),
}

impl SafetyPolicy {
    /// Checks a prompt's text before anything runs.
    pub fn check_input(&self, text: &str) -> Result<SafetyVerdict, PolicyFault> {
        self.check(Text::Input(text), true)
    }

    /// Checks a window of streamed output; `is_final` for the last one.
    pub fn check_output(&self, window: &str, is_final: bool) -> Result<SafetyVerdict, PolicyFault> {
        self.check(Text::Output(window, is_final), true)
    }

    fn check(&self, text: Text<'_>, counting: bool) -> Result<SafetyVerdict, PolicyFault> {
        let cx = CallCx {
            host: None,
            request: None,
            request_id: "",
            counting,
        };
        self.core.call(cx, |store, (input, output)| {
            let input: TypedFunc<(&str,), (SafetyVerdict,)> = input;
            let output: TypedFunc<(&str, bool), (SafetyVerdict,)> = output;
            let (verdict,) = match text {
                Text::Input(text) => input.call(store, (text,))?,
                Text::Output(window, last) => output.call(store, (window, last))?,
            };
            Ok(match verdict {
                SafetyVerdict::Block(reason) => SafetyVerdict::Block(bounded(reason)),
                allow => allow,
            })
        })
    }
}

/// A reason a policy gave, as the client will see it: at most [`MAX_ANSWER_TEXT_BYTES`]
/// bytes, cut at a character boundary and marked with `…` when longer.
pub(crate) fn bounded(mut reason: String) -> String {
    if reason.len() <= MAX_ANSWER_TEXT_BYTES {
        return reason;
    }
    let mut end = MAX_ANSWER_TEXT_BYTES - '…'.len_utf8();
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.truncate(end);
    reason.push('…');
    reason
}

/// A guest string for a message: debug-quoted, at most [`QUOTE_LIMIT`] characters.
fn quote(s: &str) -> String {
    if s.chars().count() <= QUOTE_LIMIT {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(QUOTE_LIMIT).collect();
        format!("{head:?}… ({} bytes)", s.len())
    }
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    #[test]
    fn a_reason_is_kept_whole_up_to_the_bound_and_cut_at_a_character_past_it() {
        assert_eq!(bounded("short".to_owned()), "short");
        let exact = "a".repeat(MAX_ANSWER_TEXT_BYTES);
        assert_eq!(bounded(exact.clone()), exact);
        let long = "é".repeat(MAX_ANSWER_TEXT_BYTES);
        let cut = bounded(long);
        assert!(cut.len() <= MAX_ANSWER_TEXT_BYTES);
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }
}
