// Ringmaster's CUDA kernels, compiled at run time with NVRTC (no nvcc at build time).
// Layouts match the CPU engine: int8 weight blocks of 32 with one f32 scale per block,
// row-major; K/V pools per layer laid out [block, slot, kv_head, head_dim].

#define QK 32
#define WARP 32
#define MAX_HEAD_DIM 128
// NVRTC has no math.h: minus infinity by its bits.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_down_sync(0xffffffff, v, o);
    return __shfl_sync(0xffffffff, v, 0);
}

// out[m * rows + r] = sum_k (qs[r, k] * scales[r, k / 32]) * x[m, k]; one warp per (r, m).
extern "C" __global__ void matmul_q8(const signed char* qs, const float* scales, const float* x,
                                     float* out, int rows, int cols, int m) {
    int r = blockIdx.x;
    int i = blockIdx.y;
    if (r >= rows || i >= m) return;
    const signed char* w = qs + (long)r * cols;
    const float* s = scales + (long)r * (cols / QK);
    const float* xi = x + (long)i * cols;
    float acc = 0.0f;
    for (int k = threadIdx.x; k < cols; k += WARP) acc += (float)w[k] * s[k / QK] * xi[k];
    acc = warp_sum(acc);
    if (threadIdx.x == 0) out[(long)i * rows + r] = acc;
}

// Row-wise RMS norm of x (rows of d) into out; one warp per row.
extern "C" __global__ void rms_norm(const float* x, const float* weight, float* out, int d,
                                    float eps) {
    const float* xr = x + (long)blockIdx.x * d;
    float* o = out + (long)blockIdx.x * d;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < d; k += WARP) ss += xr[k] * xr[k];
    float inv = rsqrtf(warp_sum(ss) / d + eps);
    for (int k = threadIdx.x; k < d; k += WARP) o[k] = xr[k] * inv * weight[k];
}

// Attention of token blockIdx.x, head blockIdx.y, over positions 0..=position through its
// block table; one warp, online softmax per lane, merged across lanes at the end.
// q's rows are q_stride values apart (its heads first), so attention reads Q in place inside a
// stacked QKV row.
extern "C" __global__ void paged_attention(const float* q, const float* k_pool, const float* v_pool,
                                           const int* tables, const int* table_offsets,
                                           const int* positions, float* out, int heads,
                                           int kv_heads, int head_dim, int block_size,
                                           int q_stride) {
    int token = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    int g = h / (heads / kv_heads);
    int kv_dim = kv_heads * head_dim;
    const int* table = tables + table_offsets[token];
    int n = positions[token] + 1;
    const float* qh = q + (long)token * q_stride + h * head_dim;
    float scale = rsqrtf((float)head_dim);
    float m = NEG_INF, l = 0.0f;
    float acc[MAX_HEAD_DIM];
    for (int d = 0; d < head_dim; d++) acc[d] = 0.0f;
    for (int p = lane; p < n; p += WARP) {
        long at = ((long)table[p / block_size] * block_size + p % block_size) * kv_dim + g * head_dim;
        float s = 0.0f;
        for (int d = 0; d < head_dim; d++) s += qh[d] * k_pool[at + d];
        s *= scale;
        float m2 = fmaxf(m, s);
        float correction = __expf(m - m2), weight = __expf(s - m2);
        l = l * correction + weight;
        for (int d = 0; d < head_dim; d++) acc[d] = acc[d] * correction + weight * v_pool[at + d];
        m = m2;
    }
    // Merge the lanes' (m, l, acc) into lane 0.
    for (int o = WARP / 2; o > 0; o /= 2) {
        float m_other = __shfl_down_sync(0xffffffff, m, o);
        float l_other = __shfl_down_sync(0xffffffff, l, o);
        float m2 = fmaxf(m, m_other);
        float a = (m == NEG_INF) ? 0.0f : __expf(m - m2);
        float b = (m_other == NEG_INF) ? 0.0f : __expf(m_other - m2);
        for (int d = 0; d < head_dim; d++) {
            float acc_other = __shfl_down_sync(0xffffffff, acc[d], o);
            acc[d] = acc[d] * a + acc_other * b;
        }
        l = l * a + l_other * b;
        m = m2;
    }
    if (lane == 0) {
        float* o = out + ((long)token * heads + h) * head_dim;
        for (int d = 0; d < head_dim; d++) o[d] = acc[d] / l;
    }
}

// act[i] = silu(gate[i]) * up[i] for rows laid out [gate (ffn) | up (ffn)].
extern "C" __global__ void silu_mul(const float* gate_up, float* act, int ffn, int rows) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)ffn * rows) return;
    long r = i / ffn, j = i % ffn;
    float g = gate_up[r * 2 * ffn + j], u = gate_up[r * 2 * ffn + ffn + j];
    act[i] = g / (1.0f + __expf(-g)) * u;
}

// x += y.
extern "C" __global__ void add(float* x, const float* y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// out[t] = dequantized row tokens[t] of an int8 matrix (the embedding); one block per token.
extern "C" __global__ void embed_q8(const signed char* qs, const float* scales, const int* tokens,
                                    float* out, int cols) {
    long r = tokens[blockIdx.x];
    float* o = out + (long)blockIdx.x * cols;
    for (int k = threadIdx.x; k < cols; k += blockDim.x)
        o[k] = (float)qs[r * cols + k] * scales[r * (cols / QK) + k / QK];
}

// Rotates the query heads and then the key heads at the start of each stacked QKV row
// (qkv_dim values apart) by the row's position; interleaved pairs, as GGUF llama weights are
// laid out.
extern "C" __global__ void rope_qk(float* qkv, const int* positions, const float* cos_table,
                                   const float* sin_table, int qkv_dim, int heads, int kv_heads,
                                   int head_dim) {
    int row = blockIdx.x;
    int half = head_dim / 2;
    int p = positions[row];
    for (int t = threadIdx.x; t < (heads + kv_heads) * half; t += blockDim.x) {
        int h = t / half, j = t % half;
        float* pair = qkv + (long)row * qkv_dim + h * head_dim + 2 * j;
        float c = cos_table[(long)p * half + j], s = sin_table[(long)p * half + j];
        float a = pair[0], b = pair[1];
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

// Writes each row's K and V (after its q_dim query values) into pool slot slots[row].
extern "C" __global__ void kv_store(const float* qkv, const int* slots, float* k_pool,
                                    float* v_pool, int qkv_dim, int q_dim, int kv_dim) {
    int row = blockIdx.x;
    const float* k = qkv + (long)row * qkv_dim + q_dim;
    long at = (long)slots[row] * kv_dim;
    for (int j = threadIdx.x; j < kv_dim; j += blockDim.x) {
        k_pool[at + j] = k[j];
        v_pool[at + j] = k[kv_dim + j];
    }
}

// out[i] = x[rows[i]] for rows of d values.
extern "C" __global__ void gather_rows(const float* x, const int* rows, float* out, int d) {
    const float* from = x + (long)rows[blockIdx.x] * d;
    float* to = out + (long)blockIdx.x * d;
    for (int k = threadIdx.x; k < d; k += blockDim.x) to[k] = from[k];
}
