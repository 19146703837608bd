//! Fleet-wide buckets: the seam between the tenancy rules (which buckets a request draws on,
//! and what a refusal says) and a store that gateway replicas share ([`SharedBuckets`], the
//! gateway's adapter over the cluster). With one, a request's request, input and output-debt
//! checks are one atomic call ([`crate::Caller::admit_shared`]); when the store does not answer
//! in time, the caller's own buckets stand in, each worth limit ÷ live replicas (a draw counts
//! that many times), or the request is refused when the fleet fails closed.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// One bucket a request draws on.
#[derive(Clone, Debug, PartialEq)]
pub struct Draw {
    /// The bucket's id, the same on every replica (`key:…:input`, `tenant:…:requests`).
    pub id: String,
    /// Its size, per minute.
    pub per_minute: u32,
    /// What to take (ignored for a debt check).
    pub amount: f64,
    /// Only check that it is not in debt (output buckets at admission).
    pub debt_check: bool,
}

/// What the shared store decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Drawn {
    /// Every bucket paid.
    Paid,
    /// The bucket at this index of the draws cannot pay yet; it can in `wait`.
    Short {
        /// Its index.
        index: usize,
        /// Until it can.
        wait: Duration,
    },
    /// The store did not answer in time.
    Unavailable,
}

/// A store of buckets shared by the fleet.
pub trait SharedBuckets: Send + Sync + Debug {
    /// Takes every draw or none.
    fn draw<'a>(&'a self, draws: &'a [Draw]) -> Pin<Box<dyn Future<Output = Drawn> + Send + 'a>>;
    /// Charges (`delta` > 0) or refunds (`delta` < 0) a bucket, later and in a batch.
    fn charge(&self, id: &str, per_minute: u32, delta: f64);
    /// Whether the store answered last time (else charges go to the local stand-ins).
    fn is_up(&self) -> bool;
    /// How many replicas share the limits now (at least one).
    fn live_replicas(&self) -> u32;
    /// Whether requests are let in on local buckets while the store is down.
    fn fail_open(&self) -> bool;
}
