//! Files reloaded when they change (the file watchers, SIGHUP): each router variant,
//! admission or safety policy whose component is a file is read again and swapped in when
//! its bytes changed; the listeners' certificates ([`Gateway::reload_tls`]) likewise. A
//! failure leaves what runs in place.

use crate::state::Gateway;

impl Gateway {
    /// Reads every listener's certificate, key and client CA again (SIGHUP): new handshakes
    /// use the new pair; one that does not load is logged and the old pair kept.
    pub fn reload_tls(&self) {
        for tls in [&self.tls, &self.admin_tls].into_iter().flatten() {
            tls.log_reload(tls.reload());
        }
    }

    /// Re-reads every router variant whose component is a file and swaps in the ones that
    /// changed (SIGHUP, or the file watcher). A failure leaves that variant's running version
    /// in place and is logged with its reason.
    pub fn reload_policies(&self) -> Vec<(String, Result<bool, String>)> {
        let mut outcomes = Vec::new();
        for (slot, name, path) in self.config.policies.files() {
            let outcome = std::fs::read(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|bytes| {
                    match slot {
                        "router" => {
                            let shadow = self
                                .config
                                .policies
                                .router
                                .iter()
                                .any(|v| v.name == name && v.shadow);
                            self.router.install(name, &bytes, None, shadow, None)
                        }
                        "admission" => self.admission.slot.install(name, &bytes, None),
                        _ => self.safety.slot.install(name, &bytes, None),
                    }
                    .map_err(|e| e.to_string())
                });
            match &outcome {
                Ok(true) => {
                    tracing::info!(slot, policy = name, path = %path.display(), "policy.reloaded")
                }
                Ok(false) => {}
                Err(reason) => {
                    tracing::warn!(slot, policy = name, %reason, "policy.reload_refused")
                }
            }
            outcomes.push((format!("{slot}/{name}"), outcome));
        }
        outcomes
    }

    /// The policy files to watch, with their current modification stamps.
    fn policy_file_stamps(&self) -> Vec<Option<(std::time::SystemTime, u64)>> {
        self.config
            .policies
            .files()
            .into_iter()
            .map(|(_, _, path)| {
                std::fs::metadata(path)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())))
            })
            .collect()
    }
}

/// How often configured policy files are checked for changes.
pub const POLICY_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Watches the configured policy files and reloads them when they change, until the gateway
/// is dropped.
pub(crate) async fn watch_policy_files(gateway: std::sync::Weak<Gateway>) {
    let mut stamps = match gateway.upgrade() {
        Some(gateway) => gateway.policy_file_stamps(),
        None => return,
    };
    if stamps.is_empty() {
        return;
    }
    let mut tick = tokio::time::interval(POLICY_WATCH_INTERVAL);
    loop {
        tick.tick().await;
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        let now = gateway.policy_file_stamps();
        if now != stamps {
            stamps = now;
            let gateway = gateway.clone();
            let _ = tokio::task::spawn_blocking(move || gateway.reload_policies()).await;
        }
    }
}
