//! The two ways a policy goes wrong: [`PolicyError`] when it is loaded (the caller keeps the
//! version it had) and [`PolicyFault`] when it is called (the request falls back to the
//! host's native decision), with the per-policy fault counters.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a policy could not be loaded. Each message names the policy and says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The bytes are not a WebAssembly component (not Wasm at all, or a core module).
    #[error("{0}")]
    NotAComponent(String),
    /// The component does not target the world it was loaded as: an export is missing or has
    /// the wrong type, or it imports something the host does not grant.
    #[error("{0}")]
    WrongWorld(String),
    /// The component is invalid or failed to compile.
    #[error("{0}")]
    Compile(String),
    /// Instantiating the component failed (its start-up code trapped, overran its deadline, or
    /// needed more memory than the cap).
    #[error("{0}")]
    Instantiate(String),
    /// The component loaded but faulted or answered nonsense on the synthetic probe calls.
    #[error("{0}")]
    ProbeFailed(String),
    /// The engine itself could not be set up (invalid configuration, cache directory).
    #[error("{0}")]
    Engine(String),
}

/// Why one policy call produced no decision. The host turns it into its native fallback.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyFault {
    /// The policy trapped (a panic, `unreachable`, an out-of-bounds access...). The instance
    /// was dropped.
    #[error("policy trapped: {0}")]
    Trap(String),
    /// The call ran past its deadline (or its fuel) and was interrupted.
    #[error("policy call exceeded its deadline")]
    Deadline,
    /// The policy needed more memory than its cap and then trapped.
    #[error("policy exceeded its memory limit")]
    OutOfMemory,
    /// The policy answered something the host cannot carry out (for a router: a server that
    /// is not in the pool or not healthy).
    #[error("policy gave an invalid answer: {0}")]
    InvalidAnswer(String),
    /// No instance was available and a fresh one could not be made.
    #[error("policy could not be instantiated: {0}")]
    Instantiate(String),
}

impl PolicyFault {
    /// A stable, lower-case name for metrics and logs: `trap`, `deadline`, `memory`,
    /// `invalid-answer` or `instantiate`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Trap(_) => "trap",
            Self::Deadline => "deadline",
            Self::OutOfMemory => "memory",
            Self::InvalidAnswer(_) => "invalid-answer",
            Self::Instantiate(_) => "instantiate",
        }
    }
}

/// How many calls of one policy version faulted, by kind (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// [`PolicyFault::Trap`].
    pub trap: u64,
    /// [`PolicyFault::Deadline`].
    pub deadline: u64,
    /// [`PolicyFault::OutOfMemory`].
    pub memory: u64,
    /// [`PolicyFault::InvalidAnswer`].
    pub invalid_answer: u64,
    /// [`PolicyFault::Instantiate`].
    pub instantiate: u64,
}

impl FaultCounts {
    /// All faults together.
    pub fn total(&self) -> u64 {
        self.trap + self.deadline + self.memory + self.invalid_answer + self.instantiate
    }
}

/// The live counters behind [`FaultCounts`].
#[derive(Debug, Default)]
pub(crate) struct FaultCounters {
    trap: AtomicU64,
    deadline: AtomicU64,
    memory: AtomicU64,
    invalid_answer: AtomicU64,
    instantiate: AtomicU64,
}

impl FaultCounters {
    pub(crate) fn count(&self, fault: &PolicyFault) {
        let counter = match fault {
            PolicyFault::Trap(_) => &self.trap,
            PolicyFault::Deadline => &self.deadline,
            PolicyFault::OutOfMemory => &self.memory,
            PolicyFault::InvalidAnswer(_) => &self.invalid_answer,
            PolicyFault::Instantiate(_) => &self.instantiate,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> FaultCounts {
        FaultCounts {
            trap: self.trap.load(Ordering::Relaxed),
            deadline: self.deadline.load(Ordering::Relaxed),
            memory: self.memory.load(Ordering::Relaxed),
            invalid_answer: self.invalid_answer.load(Ordering::Relaxed),
            instantiate: self.instantiate.load(Ordering::Relaxed),
        }
    }
}
