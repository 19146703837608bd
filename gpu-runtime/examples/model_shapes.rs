//! Writes a GGUF model's metadata and shapes without its weights (~1 MB for SmolLM2-135M), for
//! the streams bench to time a model of those shapes with random weights where the model itself
//! cannot be carried (`RINGMASTER_BENCH_SHAPES`; `gpu-runtime/cuda/device-bundle.sh` uses it).
//!
//! `cargo run --release -p ringmaster-gpu-runtime --example model_shapes -- MODEL OUT`
#![allow(clippy::print_stdout)]

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [model, out] = args.as_slice() else {
        return Err("usage: model_shapes MODEL.gguf OUT.gguf".into());
    };
    ringmaster_gpu_runtime::model::synthetic::write_shapes(model, out)?;
    println!(
        "{}: the shapes of {} ({} bytes)",
        out.display(),
        model.display(),
        std::fs::metadata(out)?.len()
    );
    Ok(())
}
