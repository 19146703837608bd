//! Policy components by content hash: written once under their SHA-256 (`blob:HEX`) before
//! the revision that names them is appended, read by every replica that applies it.

use sha2::{Digest, Sha256};

use crate::{CONTROL_DEADLINE, Cluster, ClusterError};

/// The content hash a blob is stored under (lowercase hex SHA-256).
pub fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Cluster {
    /// Stores `bytes` (once: an existing blob is left as it is) and returns its hash.
    pub async fn put_blob(&self, bytes: &[u8]) -> Result<String, ClusterError> {
        let hash = content_hash(bytes);
        let mut conn = self.conn();
        let key = self.key(&format!("blob:{hash}"));
        let _: Option<String> = self
            .within(
                CONTROL_DEADLINE,
                redis::cmd("SET")
                    .arg(&key)
                    .arg(bytes)
                    .arg("NX")
                    .query_async(&mut conn),
            )
            .await?;
        Ok(hash)
    }

    /// The blob stored under `hash`, checked against it.
    pub async fn get_blob(&self, hash: &str) -> Result<Vec<u8>, ClusterError> {
        let mut conn = self.conn();
        let key = self.key(&format!("blob:{hash}"));
        let bytes: Option<Vec<u8>> = self
            .within(
                CONTROL_DEADLINE,
                redis::cmd("GET").arg(&key).query_async(&mut conn),
            )
            .await?;
        let bytes = bytes.ok_or_else(|| ClusterError::Decode {
            key: key.clone(),
            reason: "no such blob".into(),
        })?;
        if content_hash(&bytes) != hash {
            return Err(ClusterError::Decode {
                key,
                reason: "the blob's content does not match its hash".into(),
            });
        }
        Ok(bytes)
    }
}
