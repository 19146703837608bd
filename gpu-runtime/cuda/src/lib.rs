//! Internal to `ringmaster-gpu-runtime`: the CUDA back end's kernels and device memory.
//!
//! Everything CUDA is loaded at run time (cudarc's dynamic loading), so this crate builds and
//! its tests run on machines without CUDA: [`Device::open`] says clearly why there is no device
//! (no driver library, no GPU), and [`compile_kernels`] needs only NVRTC's library (the
//! `nvidia-cuda-nvrtc-cu12` wheel has it), so the kernel source is checked without a GPU, down
//! to ptxas's register and stack report ([`ptxas_report`]).
//!
//! - [`KERNELS`]: the CUDA C source, compiled with NVRTC for the device's architecture and the
//!   model's head dimension when a device opens: the embedding lookup, RMS norm, rotary
//!   embedding in place in stacked QKV rows, the K/V scatter into pool slots, SiLU-gating,
//!   residual add, a row gather; the second step's paged attention (accumulator in registers)
//!   and sampling (the host sampler's definitions, only token ids out); the first step's int8
//!   GEMV and stack-accumulator attention, kept to re-measure the baseline.
//! - [`Device`]: a context, a stream, the loaded kernels and (second step) cuBLAS, with safe
//!   wrappers that check shapes before launching. [`StepPath`] picks the step.
//! - [`llama`]: the whole llama step over a paged pool in device memory, for the engine crate's
//!   CUDA executor: cuBLAS GEMMs, one pinned metadata upload, a reused workspace, sampling on
//!   the device, CUDA graphs for decode steps, one synchronisation.
//!
//! It must not schedule or know about requests; the engine crate drives it.

#![deny(missing_docs)]

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

/// The kernels' CUDA C source.
pub const KERNELS: &str = include_str!("kernels.cu");

/// Values per int8 block (as in the CPU kernels).
pub const QK: usize = 32;

/// Largest head dimension the attention kernel supports.
pub const MAX_HEAD_DIM: usize = 128;

const KERNEL_NAMES: [&str; 11] = [
    "paged_attention_v2",
    "sample_rows",
    "matmul_q8",
    "rms_norm",
    "paged_attention",
    "silu_mul",
    "add",
    "embed_q8",
    "rope_qk",
    "kv_store",
    "gather_rows",
];

/// Launches kernel `$name` on `$dev`'s stream: grid, block, then the kernel's parameters in
/// order.
macro_rules! launch {
    ($dev:expr, $name:literal, $grid:expr, $block:expr; $($arg:expr),* $(,)?) => {{
        use cudarc::driver::PushKernelArg as _;
        let mut builder = $dev.stream.launch_builder($dev.function($name));
        $( builder.arg($arg); )*
        let config = cudarc::driver::LaunchConfig {
            grid_dim: $grid,
            block_dim: $block,
            shared_mem_bytes: 0,
        };
        // SAFETY: every call site passes the kernel's parameters in order with their types
        // (kernels.cu), sizes each buffer for the grid it launches, and keeps the buffers
        // alive until the stream is synchronised (a download or `synchronize`).
        #[allow(unsafe_code)]
        unsafe {
            builder.launch(config)
        }?;
    }};
}

pub mod llama;

/// Why the CUDA back end cannot run, or a call failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so`) is not on this machine.
    #[error("no CUDA driver library (libcuda.so) on this machine")]
    NoDriver,
    /// NVRTC's library (`libnvrtc.so`) is not on this machine.
    #[error(
        "no NVRTC library (libnvrtc.so) on this machine: install the CUDA toolkit or the nvidia-cuda-nvrtc-cu12 wheel and put its lib folder on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// NVRTC refused the kernel source.
    #[error("compiling the CUDA kernels failed: {0}")]
    Compile(String),
    /// A driver call failed (no device with that ordinal, out of memory, a failed launch).
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// Arguments whose shapes disagree (a caller's bug).
    #[error("bad shapes: {0}")]
    Shape(String),
    /// cuBLAS could not be loaded or refused a call.
    #[error("cuBLAS: {0}")]
    Blas(String),
    /// Capturing a step into a CUDA graph failed (graphs are then off for the model).
    #[error("capturing a CUDA graph: {0}")]
    Graph(String),
}

/// Which implementation of the step runs: the first (`v1`: the int8 GEMV kernel, attention
/// with a stack accumulator, the legacy stream, logits to the host) kept selectable so a lent
/// GPU re-measures the baseline in the same call, or the second (`v2`, the default: cuBLAS
/// GEMMs on weights dequantised once at load, register-only attention, sampling on the device
/// with only token ids coming back, the engine's own stream without cudarc's event tracking).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepPath {
    /// The first step.
    V1,
    /// The second step.
    #[default]
    V2,
}

impl StepPath {
    /// `RINGMASTER_GPU_PATH` (`v1` or `v2`; anything else or unset: `v2`).
    pub fn from_env() -> Self {
        match std::env::var("RINGMASTER_GPU_PATH").as_deref() {
            Ok("v1") => Self::V1,
            _ => Self::V2,
        }
    }

    /// `v1` or `v2`.
    pub fn name(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        }
    }
}

/// The cuBLAS call for `out = x · Wᵀ` with row-major `W` (`rows × cols`), `x` (`m × cols`) and
/// `out` (`m × rows`). cuBLAS is column-major: row-major `W` is a column-major `cols × rows`
/// matrix, so the product is `out_cm (rows × m) = op(W_cm) · x_cm` with `op` a transpose.
pub fn gemm_config(rows: usize, cols: usize, m: usize) -> Result<GemmConfig<f32>, CudaError> {
    Ok(GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: dim(rows)?,
        n: dim(m)?,
        k: dim(cols)?,
        alpha: 1.0,
        lda: dim(cols)?,
        ldb: dim(cols)?,
        beta: 0.0,
        ldc: dim(rows)?,
    })
}

/// A dense f32 weight matrix in device memory, row-major `rows × cols`.
#[derive(Debug)]
pub struct DeviceDense {
    values: CudaSlice<f32>,
    rows: usize,
    cols: usize,
}

/// Whether the CUDA driver library can be loaded here.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library; no CUDA call is made.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::driver::sys::is_culib_present()
    }
}

/// Whether NVRTC's library can be loaded here.
pub fn nvrtc_present() -> bool {
    // SAFETY: as in `driver_present`.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::nvrtc::sys::is_culib_present()
    }
}

/// What the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOptions {
    /// The model's head dimension (a multiple of 4, at most [`MAX_HEAD_DIM`]): the step-2
    /// attention's accumulator is sized by it at compile time, so it stays in registers.
    pub head_dim: usize,
    /// The virtual architecture (`compute_90` for an H100 or H200); `None`: NVRTC's default.
    pub arch: Option<&'static str>,
}

impl Default for KernelOptions {
    fn default() -> Self {
        Self {
            head_dim: 64,
            arch: None,
        }
    }
}

impl KernelOptions {
    fn check(&self) -> Result<(), CudaError> {
        if self.head_dim == 0 || self.head_dim > MAX_HEAD_DIM || !self.head_dim.is_multiple_of(4) {
            return Err(CudaError::Shape(format!(
                "head dimension {} (the kernels take a multiple of 4 up to {MAX_HEAD_DIM})",
                self.head_dim
            )));
        }
        Ok(())
    }
}

/// The virtual architecture NVRTC should compile for on a device of compute capability
/// `(major, minor)`; `None` where no table entry (NVRTC's default then, which every device
/// since Maxwell loads).
pub fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

/// Compiles [`KERNELS`] to PTX with NVRTC's defaults (head dimension 64). Needs NVRTC's
/// library, not a GPU.
pub fn compile_kernels() -> Result<Ptx, CudaError> {
    compile_kernels_with(KernelOptions::default())
}

/// Compiles [`KERNELS`] to PTX for `options`.
pub fn compile_kernels_with(options: KernelOptions) -> Result<Ptx, CudaError> {
    options.check()?;
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("-DHEAD_DIM={}", options.head_dim)],
        arch: options.arch,
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts)
        .map_err(|e| CudaError::Compile(e.to_string()))
}

/// One kernel's resources as ptxas reports them for a real architecture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// The kernel's name.
    pub name: String,
    /// Bytes of stack frame (local memory a thread addresses: arrays indexed at run time).
    pub stack_bytes: u32,
    /// Bytes spilled to local memory (stores plus loads).
    pub spill_bytes: u32,
    /// Registers per thread.
    pub registers: u32,
}

/// Compiles [`KERNELS`] for the real architecture `sm` (e.g. `sm_90`) with `ptxas -v` and
/// returns what it reports for every kernel: the check that no hot kernel keeps an array in
/// local memory or spills, run without a GPU.
pub fn ptxas_report(head_dim: usize, sm: &str) -> Result<Vec<KernelResources>, CudaError> {
    KernelOptions {
        head_dim,
        arch: None,
    }
    .check()?;
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let source = std::ffi::CString::new(KERNELS).map_err(|e| CudaError::Compile(e.to_string()))?;
    let program = cudarc::nvrtc::result::create_program(&source, None)
        .map_err(|e| CudaError::Compile(e.to_string()))?;
    let options = [
        format!("-arch={sm}"),
        "--ptxas-options=-v".to_owned(),
        format!("-DHEAD_DIM={head_dim}"),
    ];
    // SAFETY: `program` was just created from a valid source and is destroyed once, below,
    // after its log was read.
    #[allow(unsafe_code)]
    let (compiled, log) = unsafe {
        let compiled = cudarc::nvrtc::result::compile_program(program, &options);
        let log = cudarc::nvrtc::result::get_program_log(program);
        let _ = cudarc::nvrtc::result::destroy_program(program);
        (compiled, log)
    };
    let log: Vec<u8> = log
        .map_err(|e| CudaError::Compile(e.to_string()))?
        .into_iter()
        .map(|c| c as u8)
        .take_while(|c| *c != 0)
        .collect();
    let log = String::from_utf8_lossy(&log).into_owned();
    compiled.map_err(|e| CudaError::Compile(format!("{e}: {log}")))?;
    Ok(parse_ptxas_log(&log))
}

/// Reads ptxas's `-v` lines: "Compiling entry function 'NAME'", then "N bytes stack frame,
/// N bytes spill stores, N bytes spill loads" and "Used N registers".
fn parse_ptxas_log(log: &str) -> Vec<KernelResources> {
    let number_before = |line: &str, unit: &str| -> u32 {
        line.find(unit)
            .and_then(|at| line[..at].split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let mut kernels: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            kernels.push(KernelResources {
                name: rest.split('\'').next().unwrap_or_default().to_owned(),
                stack_bytes: 0,
                spill_bytes: 0,
                registers: 0,
            });
        } else if let Some(kernel) = kernels.last_mut() {
            if line.contains("bytes stack frame") {
                kernel.stack_bytes = number_before(line, "bytes stack frame");
                kernel.spill_bytes = number_before(line, "bytes spill stores")
                    + number_before(line, "bytes spill loads");
            } else if line.contains("Used") && line.contains("registers") {
                kernel.registers = line
                    .split("Used ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
        }
    }
    kernels
}

/// An int8 weight matrix in device memory.
#[derive(Debug)]
pub struct DeviceQ8 {
    qs: CudaSlice<i8>,
    scales: CudaSlice<f32>,
    rows: usize,
    cols: usize,
}

impl DeviceQ8 {
    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// The shape of grouped-query attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Values per head (at most [`MAX_HEAD_DIM`]).
    pub head_dim: usize,
    /// Tokens per KV block.
    pub block_size: usize,
}

/// One GPU: a context, its stream, the compiled kernels and (on the second step) a cuBLAS
/// handle on that stream.
pub struct Device {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: Vec<CudaFunction>,
    blas: Option<CudaBlas>,
    /// cuBLAS's workspace, given to it once so that a captured GEMM never allocates.
    _blas_workspace: Option<CudaSlice<u8>>,
    path: StepPath,
}

/// Bytes of cuBLAS workspace (NVIDIA's recommendation for Hopper).
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.context.ordinal())
            .finish()
    }
}

impl Device {
    /// Opens GPU `ordinal` for the first step with the kernels compiled for a head dimension
    /// of 64 (the kernel tests).
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        Self::open_for(ordinal, 64, StepPath::V1)
    }

    /// Opens GPU `ordinal` for a model with heads of `head_dim` values, on `path`: the
    /// kernels are compiled for the device's architecture; the second step gets its own
    /// stream (the legacy one cannot be captured into a graph), no cudarc event tracking (one
    /// stream: the tracking's per-buffer events only cost driver calls) and cuBLAS.
    pub fn open_for(ordinal: usize, head_dim: usize, path: StepPath) -> Result<Self, CudaError> {
        // cudarc panics when it cannot load the driver library: check first.
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        let context = CudaContext::new(ordinal)?;
        let (major, minor) = context.compute_capability()?;
        let ptx = compile_kernels_with(KernelOptions {
            head_dim,
            arch: arch_for(major, minor),
        })?;
        let stream = match path {
            StepPath::V1 => context.default_stream(),
            StepPath::V2 => {
                // SAFETY: called before any allocation on this new context, and everything
                // the second step does is on the one stream made here, so no buffer is ever
                // shared between streams (what the event tracking guards).
                #[allow(unsafe_code)]
                unsafe {
                    context.disable_event_tracking()
                };
                context.new_stream()?
            }
        };
        let module = context.load_module(ptx)?;
        let functions = KERNEL_NAMES
            .iter()
            .map(|name| module.load_function(name))
            .collect::<Result<Vec<_>, _>>()?;
        let (blas, blas_workspace) = match path {
            StepPath::V1 => (None, None),
            StepPath::V2 => {
                let blas =
                    CudaBlas::new(stream.clone()).map_err(|e| CudaError::Blas(e.to_string()))?;
                let workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE_BYTES)?;
                {
                    use cudarc::driver::DevicePtr as _;
                    let (pointer, _sync) = workspace.device_ptr(&stream);
                    // SAFETY: the handle is live, the buffer is BLAS_WORKSPACE_BYTES of device
                    // memory on the handle's stream and outlives the handle (both fields of
                    // this device; `blas` is dropped first, being declared first).
                    #[allow(unsafe_code)]
                    unsafe {
                        cudarc::cublas::sys::cublasSetWorkspace_v2(
                            *blas.handle(),
                            pointer as *mut std::ffi::c_void,
                            BLAS_WORKSPACE_BYTES,
                        )
                    }
                    .result()
                    .map_err(|e| CudaError::Blas(format!("cublasSetWorkspace: {e:?}")))?;
                }
                (Some(blas), Some(workspace))
            }
        };
        Ok(Self {
            stream,
            context,
            functions,
            blas,
            _blas_workspace: blas_workspace,
            path,
        })
    }

    /// The step this device was opened for.
    pub fn path(&self) -> StepPath {
        self.path
    }

    /// Uploads a dense row-major `rows × cols` matrix.
    pub fn upload_dense(
        &self,
        values: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<DeviceDense, CudaError> {
        if values.len() != rows * cols {
            return Err(CudaError::Shape(format!(
                "{} values for a {rows}×{cols} matrix",
                values.len()
            )));
        }
        Ok(DeviceDense {
            values: self.upload(values)?,
            rows,
            cols,
        })
    }

    /// `out[i × rows + r] = Σ_k w[r, k] · x[i, k]` for the `m` rows of `x`, by cuBLAS SGEMM.
    pub fn gemm(
        &self,
        w: &DeviceDense,
        x: &CudaView<'_, f32>,
        m: usize,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), CudaError> {
        let Some(blas) = &self.blas else {
            return Err(CudaError::Blas(
                "this device was opened for the first step, which has no cuBLAS".into(),
            ));
        };
        if x.len() < m * w.cols || out.len() < m * w.rows {
            return Err(CudaError::Shape(format!(
                "GEMM of a {}×{} matrix with {} inputs into {} outputs for {m} rows",
                w.rows,
                w.cols,
                x.len(),
                out.len()
            )));
        }
        let config = gemm_config(w.rows, w.cols, m)?;
        // SAFETY: the configuration reads `m × cols` inputs and `rows × cols` weights and
        // writes `m × rows` outputs, all checked above; the buffers outlive the call on this
        // stream (the step synchronises before returning).
        #[allow(unsafe_code)]
        unsafe { blas.gemm(config, &w.values, x, out) }.map_err(|e| CudaError::Blas(e.to_string()))
    }

    /// The GPU's name.
    pub fn name(&self) -> Result<String, CudaError> {
        Ok(self.context.name()?)
    }

    /// Free and total device memory, bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.context.mem_get_info()?)
    }

    fn function(&self, name: &str) -> &CudaFunction {
        let i = KERNEL_NAMES
            .iter()
            .position(|n| *n == name)
            .expect("a kernel of KERNEL_NAMES");
        &self.functions[i]
    }

    /// Copies host values to a new device buffer.
    pub fn upload<T: cudarc::driver::DeviceRepr>(
        &self,
        values: &[T],
    ) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.clone_htod(values)?)
    }

    /// Copies a device buffer back.
    pub fn download<T: cudarc::driver::DeviceRepr>(
        &self,
        values: &CudaSlice<T>,
    ) -> Result<Vec<T>, CudaError> {
        Ok(self.stream.clone_dtoh(values)?)
    }

    /// Uploads an int8 weight matrix: `qs` row-major `rows × cols`, one scale per 32.
    pub fn upload_q8(
        &self,
        qs: &[i8],
        scales: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<DeviceQ8, CudaError> {
        if !cols.is_multiple_of(QK) || qs.len() != rows * cols || scales.len() != rows * cols / QK {
            return Err(CudaError::Shape(format!(
                "{} bytes and {} scales for a {rows}×{cols} int8 matrix",
                qs.len(),
                scales.len()
            )));
        }
        Ok(DeviceQ8 {
            qs: self.upload(qs)?,
            scales: self.upload(scales)?,
            rows,
            cols,
        })
    }

    /// `out[m × rows + r] = Σ_k w[r, k] · x[m, k]` for `m` activation rows in `x`.
    pub fn matmul_q8(
        &self,
        w: &DeviceQ8,
        x: &CudaSlice<f32>,
        m: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        if x.len() != m * w.cols || out.len() != m * w.rows {
            return Err(CudaError::Shape(format!(
                "matmul of a {}×{} matrix with {} inputs into {} outputs for {m} rows",
                w.rows,
                w.cols,
                x.len(),
                out.len()
            )));
        }
        let (rows, cols, m) = (dim(w.rows)?, dim(w.cols)?, dim(m)?);
        let config = LaunchConfig {
            grid_dim: (rows as u32, m as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(self.function("matmul_q8"));
        launch
            .arg(&w.qs)
            .arg(&w.scales)
            .arg(x)
            .arg(out)
            .arg(&rows)
            .arg(&cols)
            .arg(&m);
        // SAFETY: the argument list matches the kernel's signature, every buffer is as long
        // as the grid reads or writes (checked above), and the buffers outlive the launch on
        // this stream (downloads synchronise it).
        #[allow(unsafe_code)]
        unsafe {
            launch.launch(config)?;
        }
        Ok(())
    }

    /// Attention of each token over its positions `0..=positions[t]`, reading K/V through its
    /// block table (`tables[table_offsets[t]..]`); `q` and `out` are `tokens × heads ×
    /// head_dim`, the pools `[block, slot, kv_head, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        shape: AttentionShape,
        q: &CudaSlice<f32>,
        (k_pool, v_pool): (&CudaSlice<f32>, &CudaSlice<f32>),
        tables: &CudaSlice<i32>,
        table_offsets: &CudaSlice<i32>,
        positions: &CudaSlice<i32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let tokens = positions.len();
        let per_token = shape.heads * shape.head_dim;
        if shape.head_dim > MAX_HEAD_DIM
            || shape.kv_heads == 0
            || !shape.heads.is_multiple_of(shape.kv_heads)
            || q.len() != tokens * per_token
            || out.len() != q.len()
            || table_offsets.len() != tokens
            || k_pool.len() != v_pool.len()
        {
            return Err(CudaError::Shape(format!(
                "attention {shape:?} for {tokens} tokens with {} query values",
                q.len()
            )));
        }
        let config = LaunchConfig {
            grid_dim: (dim(tokens)? as u32, dim(shape.heads)? as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let ints = [
            dim(shape.heads)?,
            dim(shape.kv_heads)?,
            dim(shape.head_dim)?,
            dim(shape.block_size)?,
        ];
        let q_stride = dim(per_token)?;
        let mut launch = self.stream.launch_builder(self.function("paged_attention"));
        launch
            .arg(q)
            .arg(k_pool)
            .arg(v_pool)
            .arg(tables)
            .arg(table_offsets)
            .arg(positions)
            .arg(out)
            .arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&ints[3])
            .arg(&q_stride);
        // SAFETY: arguments match the kernel's signature and the shapes were checked; the
        // block tables must cover each token's positions and stay inside the pools, which the
        // engine's block manager guarantees for every plan it makes.
        #[allow(unsafe_code)]
        unsafe {
            launch.launch(config)?;
        }
        Ok(())
    }
}

fn dim(n: usize) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Shape(format!("{n} does not fit a kernel's int")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU, or `None` with a note saying why the test is skipped.
    fn device() -> Option<Device> {
        device_for(64, StepPath::V1)
    }

    /// The GPU opened for `head_dim` on `path`, or `None` with a note (the test skips).
    fn device_for(head_dim: usize, path: StepPath) -> Option<Device> {
        match Device::open_for(0, head_dim, path) {
            Ok(device) => Some(device),
            Err(e) => {
                eprintln!("skipping: no CUDA device ({e})");
                None
            }
        }
    }

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state % 2001) as f32 - 1000.0) / 500.0
            })
            .collect()
    }

    /// Whether NVRTC is here; without it the test skips, saying so, unless
    /// `RINGMASTER_REQUIRE_NVRTC` is set (CI), where that fails.
    fn nvrtc_here() -> bool {
        if nvrtc_present() {
            return true;
        }
        assert!(
            std::env::var_os("RINGMASTER_REQUIRE_NVRTC").is_none(),
            "RINGMASTER_REQUIRE_NVRTC is set but {}",
            CudaError::NoNvrtc
        );
        eprintln!("skipping: {}", CudaError::NoNvrtc);
        false
    }

    #[test]
    fn the_kernels_compile_with_nvrtc() {
        if !nvrtc_here() {
            return;
        }
        let ptx = compile_kernels().unwrap();
        let text = ptx.to_src();
        for name in KERNEL_NAMES {
            assert!(text.contains(name), "{name} missing from the PTX");
        }
    }

    /// The kernels the step-2 path runs every step, which must keep everything in registers
    /// and shared memory.
    const HOT_KERNELS: [&str; 9] = [
        "paged_attention_v2",
        "sample_rows",
        "rms_norm",
        "rope_qk",
        "kv_store",
        "silu_mul",
        "add",
        "embed_q8",
        "gather_rows",
    ];

    #[test]
    fn the_hot_kernels_keep_nothing_in_local_memory() {
        if !nvrtc_here() {
            return;
        }
        for head_dim in [64, 128] {
            let report = ptxas_report(head_dim, "sm_90").unwrap();
            for name in HOT_KERNELS {
                let kernel = report
                    .iter()
                    .find(|k| k.name == name)
                    .unwrap_or_else(|| panic!("{name} missing from ptxas's report: {report:?}"));
                assert_eq!(
                    (kernel.stack_bytes, kernel.spill_bytes),
                    (0, 0),
                    "head_dim {head_dim}: {kernel:?}"
                );
                assert!(kernel.registers > 0, "{kernel:?}");
                eprintln!("head_dim {head_dim}: {kernel:?}");
            }
            // The check can fail: step 1's attention keeps its accumulator on the stack.
            let v1 = report.iter().find(|k| k.name == "paged_attention").unwrap();
            assert!(v1.stack_bytes > 0, "{v1:?}");
            eprintln!("head_dim {head_dim}, the first step's: {v1:?}");
        }
    }

    /// cuBLAS's SGEMM as its documentation defines it (column-major; `op` per `transa` and
    /// `transb`; `C = α·op(A)·op(B) + β·C`), to check the parameters the step passes.
    fn sgemm_reference(c: &GemmConfig<f32>, a: &[f32], b: &[f32], out: &mut [f32]) {
        let (m, n, k) = (c.m as usize, c.n as usize, c.k as usize);
        let at = |t: cublasOperation_t, ld: i32, row: usize, col: usize| match t {
            cublasOperation_t::CUBLAS_OP_N => row + col * ld as usize,
            _ => col + row * ld as usize,
        };
        for i in 0..m {
            for j in 0..n {
                let sum: f32 = (0..k)
                    .map(|p| a[at(c.transa, c.lda, i, p)] * b[at(c.transb, c.ldb, p, j)])
                    .sum();
                let o = i + j * c.ldc as usize;
                out[o] = c.alpha * sum + c.beta * out[o];
            }
        }
    }

    #[test]
    fn the_gemm_parameters_compute_x_times_w_transposed_in_row_major() {
        let (rows, cols, m) = (7, 12, 3);
        let w = values(8, rows * cols);
        let x = values(9, m * cols);
        let mut out = vec![0.0; m * rows];
        sgemm_reference(&gemm_config(rows, cols, m).unwrap(), &w, &x, &mut out);
        for i in 0..m {
            for r in 0..rows {
                let want: f32 = (0..cols).map(|k| w[r * cols + k] * x[i * cols + k]).sum();
                assert!((out[i * rows + r] - want).abs() < 1e-4, "({i}, {r})");
            }
        }
    }

    #[test]
    fn ptxas_lines_are_read_per_kernel() {
        let log = "ptxas info    : Compiling entry function 'a' for 'sm_90'\n\
                   ptxas info    : Function properties for a\n\
                   \x20   512 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 0 barriers, 416 bytes cmem[0]\n\
                   ptxas info    : Compiling entry function 'b' for 'sm_90'\n\
                   \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 12 registers\n";
        let kernels = parse_ptxas_log(log);
        assert_eq!(
            kernels,
            vec![
                KernelResources {
                    name: "a".into(),
                    stack_bytes: 512,
                    spill_bytes: 12,
                    registers: 40
                },
                KernelResources {
                    name: "b".into(),
                    stack_bytes: 0,
                    spill_bytes: 0,
                    registers: 12
                },
            ]
        );
    }

    #[test]
    fn kernel_options_refuse_head_dimensions_the_kernels_cannot_take() {
        for head_dim in [0, 62, 132] {
            let options = KernelOptions {
                head_dim,
                arch: None,
            };
            assert!(matches!(options.check(), Err(CudaError::Shape(_))));
        }
        assert_eq!(arch_for(9, 0), Some("compute_90"));
        assert_eq!(arch_for(1, 0), None);
    }

    #[test]
    fn without_a_driver_opening_a_device_says_so() {
        if driver_present() {
            // Not a skip of a GPU check: this test is about machines without one.
            eprintln!("not applicable: this machine has a CUDA driver");
            return;
        }
        let err = Device::open(0).unwrap_err();
        assert!(matches!(err, CudaError::NoDriver), "{err}");
        assert!(err.to_string().contains("libcuda.so"));
    }

    #[test]
    fn the_gpu_matmul_equals_the_cpu_kernels() {
        let Some(device) = device() else { return };
        let (rows, cols, m) = (96, 256, 5);
        let w =
            ringmaster_kernels::Q8Matrix::quantize(&values(1, rows * cols), rows, cols).unwrap();
        let mut dense = vec![0.0; cols];
        let mut weights = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            w.dequantize_row(r, &mut dense);
            weights.extend_from_slice(&dense);
        }
        let (qs, scales) = llama::quantize_q8(&weights);
        let x = values(2, m * cols);
        let gpu_w = device.upload_q8(&qs, &scales, rows, cols).unwrap();
        let gpu_x = device.upload(&x).unwrap();
        let mut gpu_out = device.upload(&vec![0.0f32; m * rows]).unwrap();
        device.matmul_q8(&gpu_w, &gpu_x, m, &mut gpu_out).unwrap();
        let got = device.download(&gpu_out).unwrap();
        for i in 0..m {
            for r in 0..rows {
                w.dequantize_row(r, &mut dense);
                let want: f32 = dense.iter().zip(&x[i * cols..]).map(|(a, b)| a * b).sum();
                let have = got[i * rows + r];
                assert!(
                    (have - want).abs() < 1e-2 * (1.0 + want.abs()),
                    "{have} vs {want}"
                );
            }
        }
    }

    #[test]
    fn gpu_paged_attention_equals_the_cpu_kernel() {
        let Some(device) = device() else { return };
        let shape = AttentionShape {
            heads: 6,
            kv_heads: 2,
            head_dim: 64,
            block_size: 16,
        };
        let kv_dim = shape.kv_heads * shape.head_dim;
        let blocks = 8;
        let k_pool = values(3, blocks * shape.block_size * kv_dim);
        let v_pool = values(4, blocks * shape.block_size * kv_dim);
        // Two tokens of one sequence scattered over blocks 5, 2, 7.
        let table = [5i32, 2, 7];
        let positions = [20i32, 37];
        let q: Vec<f32> = values(5, 2 * shape.heads * shape.head_dim)
            .iter()
            .map(|v| v / 8.0)
            .collect();
        // The CPU kernel reads half-precision pools; give the GPU the same rounded values.
        let k_half: Vec<half::f16> = k_pool.iter().map(|v| half::f16::from_f32(*v)).collect();
        let v_half: Vec<half::f16> = v_pool.iter().map(|v| half::f16::from_f32(*v)).collect();
        let k_pool: Vec<f32> = k_half.iter().map(|v| v.to_f32()).collect();
        let v_pool: Vec<f32> = v_half.iter().map(|v| v.to_f32()).collect();
        let cpu = ringmaster_kernels::Cpu::new(1).unwrap();
        let cpu_shape = ringmaster_kernels::AttentionShape {
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
        };
        let per_token = shape.heads * shape.head_dim;
        let mut want = vec![0.0; 2 * per_token];
        for (t, p) in positions.iter().enumerate() {
            let offsets: Vec<usize> = (0..=*p as usize)
                .map(|p| {
                    (table[p / shape.block_size] as usize * shape.block_size + p % shape.block_size)
                        * kv_dim
                })
                .collect();
            cpu.attend(
                cpu_shape,
                &q[t * per_token..(t + 1) * per_token],
                &offsets,
                &k_half,
                &v_half,
                &mut Vec::new(),
                &mut want[t * per_token..(t + 1) * per_token],
            );
        }
        let mut out = device.upload(&vec![0.0f32; 2 * per_token]).unwrap();
        device
            .paged_attention(
                shape,
                &device.upload(&q).unwrap(),
                (
                    &device.upload(&k_pool).unwrap(),
                    &device.upload(&v_pool).unwrap(),
                ),
                &device.upload(&table).unwrap(),
                &device.upload(&[0i32, 0]).unwrap(),
                &device.upload(&positions).unwrap(),
                &mut out,
            )
            .unwrap();
        let got = device.download(&out).unwrap();
        for (have, want) in got.iter().zip(&want) {
            assert!((have - want).abs() < 1e-3, "{have} vs {want}");
        }
    }

    /// The second step's attention against the CPU kernel: several lengths (within one warp's
    /// positions, across warps, past a block stride), GQA groups of 1 to 4, head dimensions
    /// 64 and 128 (the split-lane path), through scattered block tables.
    #[test]
    fn gpu_register_attention_equals_the_cpu_kernel() {
        for (head_dim, heads, kv_heads) in [(64, 6, 2), (64, 8, 8), (128, 8, 2)] {
            let Some(device) = device_for(head_dim, StepPath::V2) else {
                return;
            };
            let block_size = 16usize;
            let kv_dim = kv_heads * head_dim;
            let blocks = 40;
            let half = |v: Vec<f32>| -> Vec<half::f16> {
                v.iter().map(|v| half::f16::from_f32(*v)).collect()
            };
            let k_half = half(values(3, blocks * block_size * kv_dim));
            let v_half = half(values(4, blocks * block_size * kv_dim));
            let k_pool: Vec<f32> = k_half.iter().map(|v| v.to_f32()).collect();
            let v_pool: Vec<f32> = v_half.iter().map(|v| v.to_f32()).collect();
            // One sequence over 38 scattered blocks; tokens at several positions.
            let table: Vec<i32> = (0..38).map(|i| i * 7 % 40).collect();
            let positions = [0i32, 5, 31, 32, 127, 128, 300, 600];
            let per_token = heads * head_dim;
            let q: Vec<f32> = values(5, positions.len() * per_token)
                .iter()
                .map(|v| v / 8.0)
                .collect();
            let cpu = ringmaster_kernels::Cpu::new(1).unwrap();
            let cpu_shape = ringmaster_kernels::AttentionShape {
                heads,
                kv_heads,
                head_dim,
            };
            let mut want = vec![0.0; positions.len() * per_token];
            for (t, p) in positions.iter().enumerate() {
                let offsets: Vec<usize> = (0..=*p as usize)
                    .map(|p| {
                        (table[p / block_size] as usize * block_size + p % block_size) * kv_dim
                    })
                    .collect();
                cpu.attend(
                    cpu_shape,
                    &q[t * per_token..(t + 1) * per_token],
                    &offsets,
                    &k_half,
                    &v_half,
                    &mut Vec::new(),
                    &mut want[t * per_token..(t + 1) * per_token],
                );
            }
            let q_d = device.upload(&q).unwrap();
            let k_d = device.upload(&k_pool).unwrap();
            let v_d = device.upload(&v_pool).unwrap();
            let tables = device.upload(&table).unwrap();
            let offsets = device.upload(&vec![0i32; positions.len()]).unwrap();
            let positions_d = device.upload(&positions).unwrap();
            let mut out = device.upload(&vec![0.0f32; want.len()]).unwrap();
            let ints = [heads, kv_heads, block_size, per_token].map(|n| dim(n).unwrap());
            let launched = (|| -> Result<(), CudaError> {
                launch!(device, "paged_attention_v2",
                    (positions.len() as u32, heads as u32, 1), (128, 1, 1);
                    &q_d, &k_d, &v_d, &tables, &offsets, &positions_d, &mut out,
                    &ints[0], &ints[1], &ints[2], &ints[3]);
                Ok(())
            })();
            launched.unwrap();
            let got = device.download(&out).unwrap();
            for (i, (have, want)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (have - want).abs() < 1e-3,
                    "head_dim {head_dim}, GQA {heads}/{kv_heads}, value {i}: {have} vs {want}"
                );
            }
        }
    }

    /// cuBLAS through [`Device::gemm`] against the CPU kernels' dequantised product.
    #[test]
    fn the_cublas_gemm_equals_the_cpu_product() {
        let Some(device) = device_for(64, StepPath::V2) else {
            return;
        };
        for (rows, cols, m) in [(96, 256, 1), (576, 576, 7), (1536, 576, 33)] {
            let w = values(6, rows * cols);
            let x = values(7, m * cols);
            let dense = device.upload_dense(&w, rows, cols).unwrap();
            let x_d = device.upload(&x).unwrap();
            let mut out = device.upload(&vec![0.0f32; m * rows]).unwrap();
            device
                .gemm(&dense, &x_d.slice(..), m, &mut out.slice_mut(..))
                .unwrap();
            let got = device.download(&out).unwrap();
            for i in 0..m {
                for r in 0..rows {
                    let want: f32 = (0..cols).map(|k| w[r * cols + k] * x[i * cols + k]).sum();
                    let have = got[i * rows + r];
                    assert!(
                        (have - want).abs() < 1e-3 * (1.0 + want.abs()),
                        "({rows}×{cols}, m {m}) [{i}, {r}]: {have} vs {want}"
                    );
                }
            }
        }
    }
}
