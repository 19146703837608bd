//! The Responses API's stored responses, shared by the fleet: a follow-up that names a
//! `previous_response_id` may land on any replica. Each is one key (`response:ID`) holding
//! the gateway's JSON, with a time to live; the gateway owns what is in it.

use std::time::Duration;

use crate::{CONTROL_DEADLINE, Cluster, ClusterError};

impl Cluster {
    /// Stores response `id` for `ttl`.
    pub async fn put_response(
        &self,
        id: &str,
        json: &[u8],
        ttl: Duration,
    ) -> Result<(), ClusterError> {
        let mut conn = self.conn();
        let key = self.key(&format!("response:{id}"));
        let _: () = self
            .within(
                CONTROL_DEADLINE,
                redis::cmd("SET")
                    .arg(&key)
                    .arg(json)
                    .arg("PX")
                    .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    /// Response `id`, if it is stored.
    pub async fn get_response(&self, id: &str) -> Result<Option<Vec<u8>>, ClusterError> {
        let mut conn = self.conn();
        let key = self.key(&format!("response:{id}"));
        self.within(
            CONTROL_DEADLINE,
            redis::cmd("GET").arg(&key).query_async(&mut conn),
        )
        .await
    }

    /// Deletes response `id`; whether it was stored.
    pub async fn delete_response(&self, id: &str) -> Result<bool, ClusterError> {
        let mut conn = self.conn();
        let key = self.key(&format!("response:{id}"));
        let deleted: u64 = self
            .within(
                CONTROL_DEADLINE,
                redis::cmd("DEL").arg(&key).query_async(&mut conn),
            )
            .await?;
        Ok(deleted > 0)
    }
}
