//! The fleet's audit trail: every admin change any replica made, newest first, as one Redis
//! list (`audit`) kept to [`AUDIT_KEPT`] entries beside the configuration log. The entries are
//! the admin side's JSON; this crate only keeps them.

use crate::{CONTROL_DEADLINE, Cluster, ClusterError};

/// Entries the fleet keeps.
pub const AUDIT_KEPT: usize = 10_000;

impl Cluster {
    /// Adds one entry (JSON text) at the front, dropping the oldest past [`AUDIT_KEPT`].
    pub async fn push_audit(&self, entry: &str) -> Result<(), ClusterError> {
        let mut conn = self.conn();
        let key = self.key("audit");
        let _: () = self
            .within(
                CONTROL_DEADLINE,
                redis::pipe()
                    .cmd("LPUSH")
                    .arg(&key)
                    .arg(entry)
                    .ignore()
                    .cmd("LTRIM")
                    .arg(&key)
                    .arg(0)
                    .arg(AUDIT_KEPT - 1)
                    .ignore()
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    /// The newest `count` entries, newest first.
    pub async fn audit(&self, count: usize) -> Result<Vec<String>, ClusterError> {
        let mut conn = self.conn();
        let last = isize::try_from(count.clamp(1, AUDIT_KEPT)).unwrap_or(1) - 1;
        self.within(
            CONTROL_DEADLINE,
            redis::cmd("LRANGE")
                .arg(self.key("audit"))
                .arg(0)
                .arg(last)
                .query_async(&mut conn),
        )
        .await
    }
}
