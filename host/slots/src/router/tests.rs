//! The router slot's laws, without a pool or a socket: which variant a key picks, what a swap
//! does to requests already routing, and how versions roll back.

use std::collections::BTreeMap;
use std::sync::Arc;

use ringmaster_policy_engine::builtin::builtin;
use ringmaster_policy_engine::{EngineConfig, PolicyEngine, PolicyFault};

use super::{DEFAULT_ROLLBACK_AFTER_FAULTS, RouterSlot, SlotError};

fn slot() -> RouterSlot {
    RouterSlot::new(
        PolicyEngine::new(EngineConfig {
            cache_dir: None,
            ..EngineConfig::default()
        })
        .unwrap(),
    )
}

fn hash(slot: &RouterSlot, name: &str) -> String {
    let set = slot.current();
    let variant = set.variants.iter().find(|v| &*v.name == name).unwrap();
    variant.policy.info().hash.clone()
}

#[test]
fn a_key_keeps_its_variant_and_the_weights_share_the_keys() {
    let slot = slot();
    slot.install(
        "a",
        builtin("consistent-hash").unwrap(),
        Some(1),
        false,
        None,
    )
    .unwrap();
    slot.install("b", builtin("round-robin").unwrap(), Some(3), false, None)
        .unwrap();
    slot.install(
        "off",
        builtin("least-loaded").unwrap(),
        Some(0),
        false,
        None,
    )
    .unwrap();
    slot.install("watch", builtin("least-loaded").unwrap(), None, true, None)
        .unwrap();
    let set = slot.current();
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for key in 0..40_000u64 {
        let key = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let picked = set.pick(key).unwrap();
        // Sticky: a session's every turn lands in one variant.
        assert!(Arc::ptr_eq(picked, set.pick(key).unwrap()));
        *counts.entry(picked.name.to_string()).or_default() += 1;
    }
    // A weight of zero and the shadow never take traffic; 1:3 splits within a percent.
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["a", "b"]);
    let share_a = f64::from(counts["a"]) / 40_000.0;
    assert!((share_a - 0.25).abs() < 0.01, "{share_a}");
    assert_eq!(set.shadow.as_ref().map(|s| &*s.name), Some("watch"));
}

#[test]
fn a_swap_leaves_requests_on_the_version_they_began_with() {
    let slot = Arc::new(slot());
    slot.install(
        "main",
        builtin("consistent-hash").unwrap(),
        Some(1),
        false,
        None,
    )
    .unwrap();
    let before = slot.current();
    let first = hash(&slot, "main");
    // Readers keep picking while the variant is swapped back and forth: none ever finds the
    // slot without a variant, and each sees one whole set.
    let readers: Vec<_> = (0..4)
        .map(|seed| {
            let slot = slot.clone();
            std::thread::spawn(move || {
                for key in 0..20_000u64 {
                    let set = slot.current();
                    let variant = set.pick(key ^ seed).expect("a variant to route");
                    assert_eq!(&*variant.name, "main");
                }
            })
        })
        .collect();
    for i in 0..5 {
        let name = if i % 2 == 0 {
            "round-robin"
        } else {
            "consistent-hash"
        };
        slot.install("main", builtin(name).unwrap(), None, false, None)
            .unwrap();
    }
    for reader in readers {
        reader.join().unwrap();
    }
    // The set a request took before the swaps still holds the first version.
    assert_eq!(before.variants[0].policy.info().hash, first);
    assert_ne!(hash(&slot, "main"), first);
    // The running bytes again change nothing.
    assert!(
        !slot
            .install("main", builtin("round-robin").unwrap(), None, false, None)
            .unwrap()
    );
}

#[test]
fn faults_in_a_row_roll_a_variant_back_and_an_answer_between_them_does_not() {
    let slot = slot();
    slot.install(
        "main",
        builtin("consistent-hash").unwrap(),
        Some(1),
        false,
        None,
    )
    .unwrap();
    let good = hash(&slot, "main");
    slot.install("main", builtin("round-robin").unwrap(), None, false, None)
        .unwrap();
    let bad = hash(&slot, "main");
    let variant = || slot.current().variants[0].clone();
    for _ in 1..DEFAULT_ROLLBACK_AFTER_FAULTS {
        slot.on_fault(&variant(), &PolicyFault::Deadline);
    }
    assert_eq!(hash(&slot, "main"), bad, "one fault short of the limit");
    slot.on_fault(&variant(), &PolicyFault::Deadline);
    assert_eq!(hash(&slot, "main"), good, "rolled back");
    assert_eq!(
        variant()
            .stats
            .faults
            .load(std::sync::atomic::Ordering::Relaxed),
        u64::from(DEFAULT_ROLLBACK_AFTER_FAULTS),
        "the variant's totals survive its versions"
    );
    // With no earlier version there is nothing to roll back to.
    assert!(matches!(
        slot.rollback("main"),
        Err(SlotError::NoPreviousVersion(_))
    ));
    assert!(matches!(
        slot.rollback("nobody"),
        Err(SlotError::UnknownVariant(_))
    ));
}

#[test]
fn an_operator_rollback_restores_the_previous_version_once_per_version() {
    let slot = slot();
    for name in ["consistent-hash", "round-robin", "least-loaded"] {
        slot.install("main", builtin(name).unwrap(), Some(1), false, None)
            .unwrap();
    }
    let hashes: Vec<String> = ["consistent-hash", "round-robin"]
        .iter()
        .map(|n| ringmaster_policy_engine::content_hash(builtin(n).unwrap()))
        .collect();
    slot.rollback("main").unwrap();
    assert_eq!(hash(&slot, "main"), hashes[1]);
    slot.rollback("main").unwrap();
    assert_eq!(hash(&slot, "main"), hashes[0]);
    assert!(slot.rollback("main").is_err());
}
