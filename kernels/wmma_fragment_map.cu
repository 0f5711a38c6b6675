// wmma_fragment_map.cu: which lane holds which element of a wmma fragment.
//
// CUDA leaves the mapping of a fragment's elements to the lanes of the warp unspecified: it
// differs between GPU generations, and the emulator has its own. This kernel makes it
// visible. It loads a 16 x 16 tile whose element (r, c) holds its own index r*16 + c (exact in
// half precision: < 2048) into a matrix_a, a matrix_b and an accumulator fragment, and each
// lane writes what its x[i] holds:
//
//   idx_h (16, 16) __half, idx_f (16, 16) float: idx[r][c] = r*16 + c, row-major
//   a_map, b_map, c_map (32, 16) float: map[lane][i] = the index x[i] of that lane holds, for
//                                       i < num_elements (the rest is not written)
//   counts (3) int: num_elements of the matrix_a, matrix_b, accumulator fragments
//
// Reading x[i] as a particular element is exactly what a kernel must not do; here it is the
// point. One block of one warp.
#include <mma.h>

using namespace nvcuda;

extern "C" __global__ void wmma_fragment_map(const __half* idx_h, const float* idx_f,
                                             float* a_map, float* b_map, float* c_map,
                                             int* counts) {
    // through shared memory: wmma needs 32-byte aligned tiles, which arguments need not be
    __shared__ __align__(32) __half tile_h[16 * 16];
    __shared__ __align__(32) float tile_f[16 * 16];
    const int lane = threadIdx.x;
    for (int e = lane; e < 16 * 16; e += 32) {
        tile_h[e] = idx_h[e];
        tile_f[e] = idx_f[e];
    }
    __syncwarp();  // every lane's part of the tiles is in shared memory before the warp loads
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::load_matrix_sync(a, tile_h, 16);
    wmma::load_matrix_sync(b, tile_h, 16);
    wmma::load_matrix_sync(c, tile_f, 16, wmma::mem_row_major);
    for (int i = 0; i < a.num_elements; ++i) a_map[lane * 16 + i] = __half2float(a.x[i]);
    for (int i = 0; i < b.num_elements; ++i) b_map[lane * 16 + i] = __half2float(b.x[i]);
    for (int i = 0; i < c.num_elements; ++i) c_map[lane * 16 + i] = c.x[i];
    if (lane == 0) {
        counts[0] = a.num_elements;
        counts[1] = b.num_elements;
        counts[2] = c.num_elements;
    }
}
