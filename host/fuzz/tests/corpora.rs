//! Every fuzz target has a committed seed corpus, and every corpus belongs to a target: a
//! target added without seeds would start from nothing in its bounded minute, and a corpus
//! left behind by a removed target would be fuzzed by no one.
//!
//! This test is also what `run.sh` names with `--test corpora` beside the targets' `--bin`s:
//! a build that includes a test resolves dev-dependency features as the test build does, so
//! the instrumented build reuses every compiled dependency.

use std::collections::BTreeSet;
use std::path::Path;

fn targets() -> BTreeSet<String> {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .expect("host/fuzz/Cargo.toml is readable");
    let mut names = BTreeSet::new();
    let mut in_bin = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(name) = line.strip_prefix("name = ") {
            names.insert(name.trim_matches('"').to_string());
        }
    }
    names
}

#[test]
fn every_target_has_seeds_and_every_corpus_a_target() {
    let targets = targets();
    assert!(
        targets.len() >= 9,
        "fuzz targets found in Cargo.toml: {targets:?}"
    );
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut corpora = BTreeSet::new();
    for entry in std::fs::read_dir(&corpus).expect("host/fuzz/corpus exists") {
        let entry = entry.expect("corpus entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let seeds = std::fs::read_dir(entry.path())
            .expect("corpus directory")
            .filter(|seed| seed.as_ref().is_ok_and(|seed| seed.path().is_file()))
            .count();
        assert!(seeds > 0, "host/fuzz/corpus/{name} has no seeds");
        corpora.insert(name);
    }
    assert_eq!(
        targets, corpora,
        "fuzz targets and corpus directories differ"
    );
}
