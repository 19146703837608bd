// Ringmaster's CUDA kernels, compiled at run time with NVRTC (no nvcc at build time).
// Layouts match the CPU engine: int8 weight blocks of 32 with one f32 scale per block,
// row-major; K/V pools per layer laid out [block, slot, kv_head, head_dim].

#define QK 32
#define WARP 32
#define MAX_HEAD_DIM 128
// The model's head dimension, given by the host when it compiles for a model (-DHEAD_DIM=64):
// the step-2 attention keeps its accumulator in registers only with a compile-time size.
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
// Warps per block of the step-2 attention (each block is one token and one query head).
#define ATTN_WARPS 4
// Threads per block of the sampling kernel (one block per row).
#define SAMPLE_THREADS 1024
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

// ---------------------------------------------------------------------------------------------
// Step 2 (the path selected by default; step 1 above stays selectable as RINGMASTER_GPU_PATH=v1).

// Lanes per position in the step-2 attention: a lane holds at most 64 values of a head, so a
// 128-wide head is split over two lanes (more would spill registers).
#define ATTN_SPLIT ((HEAD_DIM + 63) / 64)
#define LANE_DIMS (HEAD_DIM / ATTN_SPLIT)

// Attention of token blockIdx.x, query head blockIdx.y: ATTN_WARPS warps, each group of
// ATTN_SPLIT lanes taking one position at a time (positions strided over the block) with its
// LANE_DIMS-wide share of the dot product and of the accumulator in registers: HEAD_DIM is a
// compile-time constant and every loop over it unrolls, so nothing goes to local memory
// (checked by ptxas in the tests). K/V rows are read as float4. Lanes merge by shuffles,
// warps through shared memory. q rows are q_stride values apart (Q read in place in a stacked
// QKV row).
extern "C" __global__ void __launch_bounds__(ATTN_WARPS * WARP)
paged_attention_v2(const float* q, const float* k_pool, const float* v_pool, const int* tables,
                   const int* table_offsets, const int* positions, float* out, int heads,
                   int kv_heads, int block_size, int q_stride) {
    __shared__ float4 q_shared[HEAD_DIM / 4];
    __shared__ float partial_acc[ATTN_WARPS][HEAD_DIM];
    __shared__ float partial_m[ATTN_WARPS], partial_l[ATTN_WARPS];
    int token = blockIdx.x, h = blockIdx.y;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    int part = lane % ATTN_SPLIT;
    int g = h / (heads / kv_heads);
    int kv_dim = kv_heads * HEAD_DIM;
    const int* table = tables + table_offsets[token];
    int n = positions[token] + 1;
    float scale = rsqrtf((float)HEAD_DIM);
    const float* qh = q + (long)token * q_stride + h * HEAD_DIM;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) ((float*)q_shared)[d] = qh[d] * scale;
    __syncthreads();
    const float4* q4 = q_shared + part * (LANE_DIMS / 4);
    float acc[LANE_DIMS];
#pragma unroll
    for (int d = 0; d < LANE_DIMS; d++) acc[d] = 0.0f;
    float m = NEG_INF, l = 0.0f;
    // The trip count is the same for every lane of a warp, so the shuffles inside are safe.
    const int per_warp = WARP / ATTN_SPLIT, stride = ATTN_WARPS * per_warp;
    for (int base = warp * per_warp; base < n; base += stride) {
        int p = base + lane / ATTN_SPLIT;
        bool valid = p < n;
        long at = 0;
        float s = 0.0f;
        if (valid) {
            at = ((long)table[p / block_size] * block_size + p % block_size) * kv_dim +
                 g * HEAD_DIM + part * LANE_DIMS;
            const float4* k4 = (const float4*)(k_pool + at);
#pragma unroll
            for (int i = 0; i < LANE_DIMS / 4; i++) {
                float4 k = k4[i], qq = q4[i];
                s += qq.x * k.x + qq.y * k.y + qq.z * k.z + qq.w * k.w;
            }
        }
#pragma unroll
        for (int o = 1; o < ATTN_SPLIT; o *= 2) s += __shfl_xor_sync(0xffffffff, s, o);
        if (valid) {
            float m2 = fmaxf(m, s);
            float correction = __expf(m - m2), weight = __expf(s - m2);
            l = l * correction + weight;
            const float4* v4 = (const float4*)(v_pool + at);
#pragma unroll
            for (int i = 0; i < LANE_DIMS / 4; i++) {
                float4 v = v4[i];
                acc[4 * i] = acc[4 * i] * correction + weight * v.x;
                acc[4 * i + 1] = acc[4 * i + 1] * correction + weight * v.y;
                acc[4 * i + 2] = acc[4 * i + 2] * correction + weight * v.z;
                acc[4 * i + 3] = acc[4 * i + 3] * correction + weight * v.w;
            }
            m = m2;
        }
    }
    // Lanes of a warp into its first ATTN_SPLIT lanes (offsets keep each lane's part).
#pragma unroll
    for (int o = WARP / 2; o >= ATTN_SPLIT; o /= 2) {
        float m_other = __shfl_down_sync(0xffffffff, m, o);
        float l_other = __shfl_down_sync(0xffffffff, l, o);
        float m2 = fmaxf(m, m_other);
        float a = (m == NEG_INF) ? 0.0f : __expf(m - m2);
        float b = (m_other == NEG_INF) ? 0.0f : __expf(m_other - m2);
#pragma unroll
        for (int d = 0; d < LANE_DIMS; d++) {
            float acc_other = __shfl_down_sync(0xffffffff, acc[d], o);
            acc[d] = acc[d] * a + acc_other * b;
        }
        l = l * a + l_other * b;
        m = m2;
    }
    if (lane < ATTN_SPLIT) {
        if (lane == 0) {
            partial_m[warp] = m;
            partial_l[warp] = l;
        }
#pragma unroll
        for (int d = 0; d < LANE_DIMS; d++) partial_acc[warp][part * LANE_DIMS + d] = acc[d];
    }
    __syncthreads();
    // Warps: one thread per output value merges the ATTN_WARPS partials.
    float m_all = NEG_INF;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) m_all = fmaxf(m_all, partial_m[w]);
    float* o = out + ((long)token * heads + h) * HEAD_DIM;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) {
            float f = (partial_m[w] == NEG_INF) ? 0.0f : __expf(partial_m[w] - m_all);
            num += partial_acc[w][d] * f;
            den += partial_l[w] * f;
        }
        o[d] = num / den;
    }
}

// Floats as unsigned keys in the same order (negative floats flipped whole, positive ones with
// the sign bit set), so a threshold on logits is a search over integers.
__device__ __forceinline__ unsigned order_key(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Sum over the block; every thread gets it. `scratch` holds a float per warp.
__device__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (threadIdx.x < blockDim.x / WARP) ? scratch[threadIdx.x] : 0.0f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}

// Token of each row of `logits` (rows × vocab), one block of SAMPLE_THREADS per row, with
// the host sampler's definitions (gpu-runtime/src/model/sampler.rs, its Rust mirror): greedy
// at temperature ≤ 0 or top-k 1 (the first maximum); else the top-k floor (the k-th largest
// logit, every tie kept) and the top-p floor (the largest logit whose upper set holds p of
// the mass), both found by binary search over order keys; then inverse CDF in vocabulary
// order at u × the kept mass: each thread sums a contiguous chunk, a block scan places the
// target, and the thread whose chunk holds it walks it. Only token ids leave the device.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_rows(const float* logits, int vocab, const float* temperature, const int* top_k,
            const float* top_p, const float* uniform, int* tokens) {
    __shared__ float scratch[SAMPLE_THREADS / WARP];
    __shared__ float chunk_sums[SAMPLE_THREADS];
    __shared__ unsigned best_key[SAMPLE_THREADS / WARP];
    __shared__ int best_index[SAMPLE_THREADS / WARP];
    __shared__ int chosen;
    int row = blockIdx.x, t = threadIdx.x;
    int lane = t % WARP, warp = t / WARP;
    const float* x = logits + (long)row * vocab;

    // The first maximum: the largest key, the smallest index among equals.
    unsigned key = 0;
    int index = 0x7fffffff;
    for (int i = t; i < vocab; i += blockDim.x) {
        unsigned k = order_key(x[i]);
        if (k > key || (k == key && i < index)) { key = k; index = i; }
    }
    for (int o = WARP / 2; o > 0; o /= 2) {
        unsigned k2 = __shfl_down_sync(0xffffffff, key, o);
        int i2 = __shfl_down_sync(0xffffffff, index, o);
        if (k2 > key || (k2 == key && i2 < index)) { key = k2; index = i2; }
    }
    if (lane == 0) { best_key[warp] = key; best_index[warp] = index; }
    __syncthreads();
    if (t == 0) {
        unsigned k = best_key[0];
        int i = best_index[0];
        for (int w = 1; w < blockDim.x / WARP; w++)
            if (best_key[w] > k || (best_key[w] == k && best_index[w] < i)) { k = best_key[w]; i = best_index[w]; }
        best_key[0] = k;
        best_index[0] = i;
    }
    __syncthreads();
    unsigned max_key = best_key[0];
    int argmax = best_index[0];
    float row_max = key_value(max_key);
    float temp = temperature[row];
    int k_cut = top_k[row];
    // row_max - row_max is 0 only for a finite max (NaN for an infinite or NaN one).
    if (!(temp > 0.0f) || k_cut == 1 || vocab < 2 || !(row_max - row_max == 0.0f)) {
        if (t == 0) tokens[row] = argmax;
        return;
    }
    float inv_t = 1.0f / temp;

    // Top-k floor: the largest key with at least k logits at or above it.
    unsigned floor_key = 0;
    if (k_cut > 0 && k_cut < vocab) {
        unsigned lo = 0, hi = max_key;  // count(>= lo) >= k always; find the largest such key
        while (lo < hi) {
            unsigned mid = lo + (hi - lo + 1) / 2;
            float count = 0.0f;
            for (int i = t; i < vocab; i += blockDim.x) count += order_key(x[i]) >= mid ? 1.0f : 0.0f;
            if (block_sum(count, scratch) >= (float)k_cut) lo = mid; else hi = mid - 1;
        }
        floor_key = lo;
    }
    float total = 0.0f;
    for (int i = t; i < vocab; i += blockDim.x)
        if (order_key(x[i]) >= floor_key) total += __expf((x[i] - row_max) * inv_t);
    total = block_sum(total, scratch);

    // Top-p floor: the largest key whose upper set holds p of the kept mass.
    float p = top_p[row];
    if (p < 1.0f) {
        float need = p * total;
        unsigned lo = floor_key, hi = max_key;
        while (lo < hi) {
            unsigned mid = lo + (hi - lo + 1) / 2;
            float mass = 0.0f;
            for (int i = t; i < vocab; i += blockDim.x)
                if (order_key(x[i]) >= mid) mass += __expf((x[i] - row_max) * inv_t);
            if (block_sum(mass, scratch) >= need) lo = mid; else hi = mid - 1;
        }
        if (lo > floor_key) {
            floor_key = lo;
            total = 0.0f;
            for (int i = t; i < vocab; i += blockDim.x)
                if (order_key(x[i]) >= floor_key) total += __expf((x[i] - row_max) * inv_t);
            total = block_sum(total, scratch);
        }
    }

    // Inverse CDF in vocabulary order over contiguous chunks.
    float target = uniform[row] * total;
    int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    int begin = t * chunk, end = min(vocab, begin + chunk);
    float mine = 0.0f;
    int last_kept = -1;
    for (int i = begin; i < end; i++)
        if (order_key(x[i]) >= floor_key) { mine += __expf((x[i] - row_max) * inv_t); last_kept = i; }
    chunk_sums[t] = mine;
    if (t == 0) chosen = -1;
    __syncthreads();
    // Inclusive scan (Hillis-Steele) of the chunk sums.
    for (int o = 1; o < blockDim.x; o *= 2) {
        float add = t >= o ? chunk_sums[t - o] : 0.0f;
        __syncthreads();
        chunk_sums[t] += add;
        __syncthreads();
    }
    // Chunk t covers [sum before it, its inclusive sum): adjacent intervals, one of them holds
    // the target unless rounding left it past the end.
    float before = t > 0 ? chunk_sums[t - 1] : 0.0f;
    if (mine > 0.0f && before <= target && target < chunk_sums[t]) {
        float acc = before;
        int pick = last_kept;
        for (int i = begin; i < end; i++) {
            if (order_key(x[i]) >= floor_key) {
                acc += __expf((x[i] - row_max) * inv_t);
                if (acc > target) { pick = i; break; }
            }
        }
        atomicMax(&chosen, pick);
    }
    __syncthreads();
    if (chosen < 0) {
        // Rounding put the target past the last chunk: the last kept id, as the mirror does.
        unsigned k = last_kept < 0 ? 0u : (unsigned)last_kept;
        for (int o = WARP / 2; o > 0; o /= 2) k = max(k, __shfl_down_sync(0xffffffff, k, o));
        if (lane == 0) best_key[warp] = k;
        __syncthreads();
        if (t == 0) {
            unsigned k_all = 0;
            for (int w = 0; w < blockDim.x / WARP; w++) k_all = max(k_all, best_key[w]);
            chosen = (int)k_all;
        }
        __syncthreads();
    }
    if (t == 0) tokens[row] = chosen;
}
