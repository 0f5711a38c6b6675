// native_sgemm.cpp: kernels/sgemm_tiled.cu as a CPU compiler would run it once a block's threads
// became loops between barriers (the CuPBoP / COX transformation): the native anchor that
// `python -m ckptlab bench emu` times beside the emulator, built with the system's g++ -O2.
//
// Each region of the kernel between two __syncthreads becomes a loop over the block's threads
// (tr, tc); what a thread keeps across a barrier (its accumulator) becomes an array indexed by
// the thread. Every thread does the same operations in the same order as in the .cu file (one
// multiply, one add per k, no fused multiply-add at -O2 on x86-64), so C is bitwise the
// emulator's (the benchmark checks it).
//
// sgemm_one_thread_at_a_time: the same regions, but each thread runs its part of a region whole
// before the next one starts, with a call between threads that the compiler cannot see through
// (nor vectorize across): the order a fiber scheduler runs the threads in, with switches that
// cost nothing. Its time is the floor of any emulator that runs one thread at a time;
// sgemm_loops's, where independent threads' multiply-adds overlap, is what the compile-time
// split at barriers could reach.
#ifndef TILE
#define TILE 16
#endif

extern "C" void sgemm_loops(const float* A, const float* B, float* C, int M, int N, int K) {
    const int grid_x = (N + TILE - 1) / TILE, grid_y = (M + TILE - 1) / TILE;
    for (int by = 0; by < grid_y; ++by)
        for (int bx = 0; bx < grid_x; ++bx) {  // one block
            float As[TILE][TILE], Bs[TILE][TILE];
            float acc[TILE][TILE];  // the thread-private accumulator, one per thread
            for (int tr = 0; tr < TILE; ++tr)
                for (int tc = 0; tc < TILE; ++tc) acc[tr][tc] = 0.0f;
            for (int k0 = 0; k0 < K; k0 += TILE) {
                for (int tr = 0; tr < TILE; ++tr)  // up to the first __syncthreads
                    for (int tc = 0; tc < TILE; ++tc) {
                        const int row = by * TILE + tr, col = bx * TILE + tc;
                        As[tr][tc] = (row < M && k0 + tc < K) ? A[row * K + k0 + tc] : 0.0f;
                        Bs[tr][tc] = (k0 + tr < K && col < N) ? B[(k0 + tr) * N + col] : 0.0f;
                    }
                for (int tr = 0; tr < TILE; ++tr)  // up to the second
                    for (int tc = 0; tc < TILE; ++tc) {
                        float a = acc[tr][tc];
                        for (int k = 0; k < TILE; ++k) a += As[tr][k] * Bs[k][tc];
                        acc[tr][tc] = a;
                    }
            }
            for (int tr = 0; tr < TILE; ++tr)  // after the loop
                for (int tc = 0; tc < TILE; ++tc) {
                    const int row = by * TILE + tr, col = bx * TILE + tc;
                    if (row < M && col < N) C[row * N + col] = acc[tr][tc];
                }
        }
}

// Between two threads: a call the compiler cannot see into or move loads and stores across.
extern "C" __attribute__((noinline)) void next_thread() { asm volatile("" ::: "memory"); }

extern "C" void sgemm_one_thread_at_a_time(const float* A, const float* B, float* C, int M, int N,
                                           int K) {
    const int grid_x = (N + TILE - 1) / TILE, grid_y = (M + TILE - 1) / TILE;
    for (int by = 0; by < grid_y; ++by)
        for (int bx = 0; bx < grid_x; ++bx) {
            float As[TILE][TILE], Bs[TILE][TILE];
            float acc[TILE][TILE];
            for (int tr = 0; tr < TILE; ++tr)
                for (int tc = 0; tc < TILE; ++tc) acc[tr][tc] = 0.0f;
            for (int k0 = 0; k0 < K; k0 += TILE) {
                for (int tr = 0; tr < TILE; ++tr)
                    for (int tc = 0; tc < TILE; ++tc) {
                        const int row = by * TILE + tr, col = bx * TILE + tc;
                        As[tr][tc] = (row < M && k0 + tc < K) ? A[row * K + k0 + tc] : 0.0f;
                        Bs[tr][tc] = (k0 + tr < K && col < N) ? B[(k0 + tr) * N + col] : 0.0f;
                        next_thread();
                    }
                for (int tr = 0; tr < TILE; ++tr)
                    for (int tc = 0; tc < TILE; ++tc) {
                        float a = acc[tr][tc];
                        for (int k = 0; k < TILE; ++k) a += As[tr][k] * Bs[k][tc];
                        acc[tr][tc] = a;
                        next_thread();
                    }
            }
            for (int tr = 0; tr < TILE; ++tr)
                for (int tc = 0; tc < TILE; ++tc) {
                    const int row = by * TILE + tr, col = bx * TILE + tc;
                    if (row < M && col < N) C[row * N + col] = acc[tr][tc];
                }
        }
}
