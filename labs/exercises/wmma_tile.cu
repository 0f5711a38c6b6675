// Exercise wmma_tile (lab 07): one tile of a 16-bit matmul on tensor cores (wmma)
// One warp computes one 16 x 16 tile of C = A B. For each k-tile the warp has staged
// As (16 x KT) and Bs (KT x 16), row-major, in shared memory; you load them into the
// fragments a and b, multiply-accumulate into acc, and at the end store acc to Cs.
// Fill in the 3 steps marked '>>> YOUR CODE'; everything else is given.
// Check: python -m ckptlab exercise check wmma_tile   (--hint 2: a second hint)
// Solution (try first): kernels/wmma_gemm.cu, the kernel the labs run.

// wmma_gemm.cu: C = A B on tensor cores (nvcuda::wmma): 16-bit inputs, fp32 accumulate.
//
//   A (M, K), B (K, N) row-major in T, C (M, N) fp32 row-major; all contiguous.
//   T = __half or __nv_bfloat16: m16n16k16 tiles; T = float: tf32 m16n16k8 tiles (each input
//   rounded to tf32 with __float_to_tf32 after the load, as cuBLAS's TF32 mode does).
//
// The same tiling as sgemm_tiled.cu, so that the two compare one thing, CUDA cores in fp32
// against tensor cores in 16 bits: one block computes one 16 x 16 tile of C, here with one
// warp instead of 256 threads. For each k-tile the warp stages a 16 x KT tile of A and a KT x 16
// tile of B in shared memory (zeros past the tails of M, N, K, which are never read from
// global memory), loads them into fragments and multiplies: acc = A_tile B_tile + acc.
// At the end the accumulator goes through shared memory to C, keeping only in-range elements.
//
// Global traffic (what the emulator counts, exactly; sizeof(T) = 2 or 4):
//   A read  ceil(N / 16) times: M * K * sizeof(T) * ceil(N / 16) bytes
//   B read  ceil(M / 16) times: K * N * sizeof(T) * ceil(M / 16) bytes
//   C written once:             M * N * 4 bytes
// FLOPs: 2 M N K, as sgemm_tiled; with 2-byte inputs the operand bytes are half of its.
#include <mma.h>

#include "common.cuh"

#define WMMA_TILE 16  // rows and columns of the C tile one warp computes

using namespace nvcuda;

// The fragments for each input type: half and bf16 take k = 16, tf32 k = 8.
template <class T> struct Tiles;
template <> struct Tiles<__half> {
    static constexpr int KT = 16;
    using Elem = __half;
};
template <> struct Tiles<__nv_bfloat16> {
    static constexpr int KT = 16;
    using Elem = __nv_bfloat16;
};
// tf32 wmma (precision::tf32, __float_to_tf32) exists from sm_80 on: compiled for sm_75 (a T4)
// the file keeps its 16-bit types only, and wmma_gemm<float> is refused (ckptlab.kernels.archs).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <> struct Tiles<float> {
    static constexpr int KT = 8;
    using Elem = wmma::precision::tf32;
};
#endif

template <class T>
__global__ void __launch_bounds__(WARP) wmma_gemm(const T* A, const T* B, float* C, int M,
                                                  int N, int K) {
    constexpr int T16 = WMMA_TILE, KT = Tiles<T>::KT;
    using Elem = typename Tiles<T>::Elem;
    __shared__ __align__(32) T As[T16][KT];  // As[r][k] = A[row0 + r, k0 + k]
    __shared__ __align__(32) T Bs[KT][T16];  // Bs[k][c] = B[k0 + k, col0 + c]
    __shared__ __align__(32) float Cs[T16][T16];
    const int lane = threadIdx.x;
    const int row0 = blockIdx.y * T16, col0 = blockIdx.x * T16;

    wmma::fragment<wmma::matrix_a, 16, 16, KT, Elem, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, KT, Elem, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, KT, float> acc;
    wmma::fill_fragment(acc, 0.0f);

    for (int k0 = 0; k0 < K; k0 += KT) {
        for (int e = lane; e < T16 * KT; e += WARP) {  // stage the tiles, zeros past the tails
            const int r = e / KT, k = e % KT;
            As[r][k] = (row0 + r < M && k0 + k < K) ? A[(long long)(row0 + r) * K + k0 + k] : T(0.0f);
        }
        for (int e = lane; e < KT * T16; e += WARP) {
            const int k = e / T16, c = e % T16;
            Bs[k][c] = (k0 + k < K && col0 + c < N) ? B[(long long)(k0 + k) * N + col0 + c] : T(0.0f);
        }
        __syncwarp();  // every lane's part of the tiles is in shared memory before the warp loads
        // >>> YOUR CODE, step 1 of 3: the staged tiles As and Bs into the fragments a and b
        //     Load the staged tiles into the fragments, the whole warp together
        //     (wmma::load_matrix_sync, one call per fragment): A's 16 x KT tile As into a,
        //     B's KT x 16 tile Bs into b. Each load needs where the tile starts in shared
        //     memory and its leading dimension: the distance, in elements, from one row to
        //     the next, i.e. the row length of that tile as declared. As and Bs differ,
        //     and KT is 16 for the 16-bit types but 8 in the tf32 instantiation of the
        //     same file.
        // <<< end of step 1
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        if constexpr (KT == 8) {  // tf32: round each input (the same for every element)
            for (int i = 0; i < a.num_elements; ++i) a.x[i] = wmma::__float_to_tf32(a.x[i]);
            for (int i = 0; i < b.num_elements; ++i) b.x[i] = wmma::__float_to_tf32(b.x[i]);
        }
#endif
        // >>> YOUR CODE, step 2 of 3: one tensor-core multiply-accumulate of the tile pair
        //     One tensor-core multiply-accumulate of the tile pair, the whole warp
        //     together (wmma::mma_sync): acc becomes a b + acc. acc carries the sum over
        //     the k-tiles: it was zero-filled before the loop, and each k-tile's product
        //     is added to what the earlier ones left.
        // <<< end of step 2
        __syncwarp();  // the loads are done before the next k-tile overwrites As and Bs
    }

    // >>> YOUR CODE, step 3 of 3: the accumulator out to the shared tile Cs
    //     Store the accumulator into the shared tile Cs (wmma::store_matrix_sync):
    //     where Cs starts, its leading dimension (a row of Cs holds 16 elements) and
    //     its layout, which must be the one Cs is read in below (Cs[r][c]: row-major).
    //     The given code then copies Cs to C.
    // <<< end of step 3
    __syncwarp();  // the whole C tile is in shared memory before lanes read other lanes' parts
    for (int e = lane; e < T16 * T16; e += WARP) {
        const int r = e / T16, c = e % T16;
        if (row0 + r < M && col0 + c < N) C[(long long)(row0 + r) * N + col0 + c] = Cs[r][c];
    }
}
