//! The int8 matmul at SmolLM2-135M's shapes, per instruction set, for one activation row
//! (decode) and for 16 (a batch): `cargo bench -p ringmaster-kernels --bench matmul`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ringmaster_kernels::{Cpu, Format, Isa, Q8Matrix, Q8Rows, Weights};

fn matmul(c: &mut Criterion) {
    // The fused gate+up projection of one layer: 3072 × 576.
    let (rows, cols) = (3072, 576);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 255) as f32 / 127.0 - 1.0)
        .collect();
    let w = Q8Matrix::quantize(&w, rows, cols).unwrap();
    let mut group = c.benchmark_group("matmul_q8_3072x576");
    for isa in [Isa::Scalar, Isa::Avx, Isa::Avx2] {
        if !isa.available() {
            continue;
        }
        let cpu = Cpu::with_isa(isa, 1).unwrap();
        for m in [1usize, 16] {
            let x: Vec<f32> = (0..m * cols)
                .map(|i| ((i * 31) % 97) as f32 / 50.0 - 1.0)
                .collect();
            let mut q = Q8Rows::new();
            q.quantize(&x, m, cols).unwrap();
            let mut out = vec![0.0; m * rows];
            group.throughput(Throughput::Elements((m * rows * cols) as u64));
            group.bench_function(format!("{}_m{m}", isa.name()), |b| {
                b.iter(|| cpu.matmul_q8(&w, &q, &mut out))
            });
        }
    }
    group.finish();

    // The tied output head at batch 1: 49152 × 576, larger than the last-level cache, so this
    // is the rate weights stream from memory (decode at batch 1 is bound by it).
    let (rows, cols) = (49152, 576);
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 255) as f32 / 127.0 - 1.0)
        .collect();
    let mut group = c.benchmark_group("matmul_49152x576_m1");
    let cpu = Cpu::new(1).unwrap();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 31) % 97) as f32 / 50.0 - 1.0)
        .collect();
    let mut q = Q8Rows::new();
    q.quantize(&x, 1, cols).unwrap();
    let mut out = vec![0.0; rows];
    for format in [Format::Q8, Format::Q4] {
        let w = Weights::quantize(format, &values, rows, cols).unwrap();
        group.throughput(Throughput::Bytes(w.bytes() as u64));
        group.bench_function(format!("{format:?}_{}", cpu.isa().name()), |b| {
            b.iter(|| cpu.matmul(&w, &q, &mut out))
        });
    }
    group.finish();
}

criterion_group!(benches, matmul);
criterion_main!(benches);
