/* Two threads on one decode step: the team of the threads build (kernels-threads.wasm).
 *
 * That build runs on a shared WebAssembly.Memory of its own (Pyodide's memory cannot be
 * shared), in which the host keeps the weights resident; a helper web worker sits in
 * team_worker() and the Pyodide worker calls team_run(). Both threads then run the same step
 * function with their thread id: every product is split by output rows (each row is computed
 * exactly as one thread computes it, so the numbers do not change), the small elementwise
 * phases run on thread 0, and a barrier separates phases that read what the other thread
 * wrote. The other builds compile the same step code for one thread: the barrier is then
 * nothing and every share is the whole.
 *
 * The control block lives in the shared memory (the host allocates it, 16-byte aligned); it
 * is only ever touched through the atomics below.
 */
#ifndef CANDLE_KERNELS_TEAM_H
#define CANDLE_KERNELS_TEAM_H

#include <stdint.h>

typedef struct {
    int32_t generation; /* bumped by team_run for every job; the helper waits on it */
    int32_t job;        /* TEAM_JOB_* */
    int32_t args;       /* the job's argument block (i32 words; f32 as bits) */
    int32_t nthreads;   /* of this job: 2, or 1 when the helper is not there */
    int32_t alive;      /* 1 while a helper is inside team_worker */
    int32_t count;      /* barrier arrivals */
    int32_t sense;      /* barrier phase, flipped by the last arrival */
    int32_t jobs_done;  /* jobs the helper took part in (for tests and the page's footer) */
} TeamCtrl;

#define TEAM_CTRL_BYTES 32
#define TEAM_JOB_STOP 0
#define TEAM_JOB_LLAMA_STEP 1
#define TEAM_JOB_WHISPER_STEP 2
#define TEAM_JOB_WHISPER_ENCODER 3

/* Argument blocks of the jobs: a header, then one record per block (words; the layouts are
 * backend/wasm_abi.py's TEAM_LLAMA_* and TEAM_WHISPER_* tables, which the host fills). */
#define TEAM_LLAMA_HEADER 21
#define TEAM_LLAMA_LAYER 25
#define TEAM_WHISPER_HEADER 21
#define TEAM_WHISPER_BLOCK 29
#define TEAM_ENCODER_HEADER 19
#define TEAM_ENCODER_BLOCK 14

/* Row shares start at multiples of this: the matrix-vector kernels work on 4 rows at a time
 * and the dequantized tiles on 8, so an aligned cut gives each row the same code path (and
 * the same roundings) as the whole product has. */
#define TEAM_ROW_ALIGN 16

/* Busy-wait this many polls (tens of milliseconds) before sleeping in memory.atomic.wait32.
 * A step has ~270 barriers (30 LLaMA blocks x 9) a few hundred microseconds apart, and a
 * wake-up from wait costs about that much: measured under wasmtime on SmolLM2 Q4_1, a step
 * took 27-32 ms on two threads with 2^16 polls and 19.3-19.7 ms with 2^24 (34-41 ms alone).
 * The helper also polls this long for the next step (the caller's Python between tokens takes
 * a few ms), then sleeps: an idle page costs no CPU. */
#define TEAM_SPINS (1 << 24)

/* The start of thread `t`'s share of `total` items (t = n: the end), in chunks aligned to
 * `align`; the share is [team_lo(t), team_lo(t + 1)). */
static inline __attribute__((always_inline)) int team_lo(int total, int align, int t, int n) {
    if (n <= 1) return t <= 0 ? 0 : total;
    int chunk = (total + n - 1) / n;
    chunk = (chunk + align - 1) / align * align;
    int lo = t * chunk;
    return lo < total ? lo : total;
}

#ifdef KERNELS_THREADS
/* Sense-reversing barrier of n threads (n <= 1: nothing). */
static inline __attribute__((always_inline)) void team_barrier(TeamCtrl *c, int n) {
    if (n <= 1) return;
    int sense = __atomic_load_n(&c->sense, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&c->count, 1, __ATOMIC_ACQ_REL) == n) {
        __atomic_store_n(&c->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&c->sense, sense ^ 1, __ATOMIC_RELEASE);
        __builtin_wasm_memory_atomic_notify(&c->sense, (unsigned)n);
        return;
    }
    for (int spin = 0; __atomic_load_n(&c->sense, __ATOMIC_ACQUIRE) == sense; spin++) {
        if (spin >= TEAM_SPINS) __builtin_wasm_memory_atomic_wait32(&c->sense, sense, -1);
    }
}
#else
static inline __attribute__((always_inline)) void team_barrier(TeamCtrl *c, int n) {
    (void)c;
    (void)n;
}
#endif

#endif
