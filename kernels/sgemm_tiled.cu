// sgemm_tiled.cu: C = A B in fp32, the textbook shared-memory tiled matrix product.
//
//   A (M, K), B (K, N), C (M, N), all row-major and contiguous.
//   One block computes one TILE x TILE tile of C; one thread one element of it.
//   For each k-tile: the block stages a TILE x TILE tile of A and of B in shared memory, then
//   every thread reads TILE values of each from there (shared) instead of from global memory.
//
// Global traffic (what the emulator counts, exactly; ceil_div = ceil):
//   A read  ceil(N / TILE) times: M * K * 4 * ceil(N / TILE) bytes
//   B read  ceil(M / TILE) times: K * N * 4 * ceil(M / TILE) bytes
//   C written once:               M * N * 4 bytes
// FLOPs: 2 M N K. Arithmetic intensity 2 MNK / (4 MK N/TILE + 4 KN M/TILE) = TILE / 4 FLOP
// per byte at large sizes: 4 for TILE = 16, below an A100's fp32 ridge (~9.6): bigger tiles
// (or register tiling) are how a real SGEMM becomes compute-bound; the lab's roofline shows it.
#include "common.cuh"

#ifndef TILE
#define TILE 16
#endif

extern "C" __global__ void sgemm_tiled(const float* A, const float* B, float* C, int M, int N,
                                       int K) {
    __shared__ float As[TILE][TILE];  // As[r][k] = A[row0 + r, k0 + k]
    __shared__ float Bs[TILE][TILE];  // Bs[k][c] = B[k0 + k, col0 + c]
    const int tr = threadIdx.y, tc = threadIdx.x;
    const int row = blockIdx.y * TILE + tr, col = blockIdx.x * TILE + tc;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        // Stage the tiles; out-of-range elements (the tails of M, N, K) become 0 and are
        // never read from global memory.
        As[tr][tc] = (row < M && k0 + tc < K) ? A[row * K + k0 + tc] : 0.0f;
        Bs[tr][tc] = (k0 + tr < K && col < N) ? B[(k0 + tr) * N + col] : 0.0f;
        __syncthreads();  // the tiles are complete before anyone reads them
        for (int k = 0; k < TILE; ++k) acc += As[tr][k] * Bs[k][tc];  // C_rc += A_rk B_kc
        __syncthreads();  // everyone is done reading before the next k-tile overwrites them
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
