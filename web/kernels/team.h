/* Two threads on one decode step: the team of the threads build (kernels-threads.wasm).
 *
 * That build runs on a shared WebAssembly.Memory of its own (Pyodide's memory cannot be
 * shared), in which the host keeps the weights resident; a helper web worker sits in
 * team_worker() and the Pyodide worker calls team_run(). Both threads then run the same step
 * function with their thread id: every product is split by output rows (each row is computed
 * exactly as one thread computes it, so the numbers do not change), the small elementwise
 * phases run on thread 0 or on both (LLaMA's norms: each thread the whole, into its own
 * buffer), and a barrier separates phases that read what the other thread wrote. The other builds compile the same step code for one thread: the barrier is then
 * nothing and every share is the whole.
 *
 * The control block (TeamCtrl), the job codes and the argument blocks' layouts are the ABI
 * table's (kernels_abi.h, generated from backend/wasm/abi.py). The control block lives in the
 * shared memory at a fixed place; it is only ever touched through the atomics below.
 */
#ifndef CANDLE_KERNELS_TEAM_H
#define CANDLE_KERNELS_TEAM_H

#include <stdint.h>

#include "kernels_abi.h"

/* The jobs: job `job` (TEAM_JOB_*) run as thread `tid` of `nt` on the argument block `args` (a
 * header, then one record per block: TEAM_LLAMA_HEADER and TEAM_LLAMA_LAYER words, ...), each
 * thread with its own scratch; TEAM_JOB_STOP and an id without a job run nothing. The one
 * function of this type is the job table (team_jobs.c, over the step files' jobs), which hands
 * itself to team_fork_join and team_serve: team.c calls it through that pointer only, so the
 * team (this header, team.c) names no step while the steps call its barrier, and the files
 * depend one way (team_jobs.c -> the steps -> team.h; team_jobs.c -> team.c). */
typedef void (*TeamJobs)(int job, int tid, int nt, TeamCtrl *team, const int32_t *args,
                         uint8_t *scratch);

/* team.c, what the exports team_run and team_worker (team_jobs.c) do: team_fork_join publishes
 * `job` to the helper when it is there, runs thread 0's share and meets it at the final barrier
 * (returns the number of threads that ran it); team_serve is the helper's loop (returns only
 * for TEAM_JOB_STOP). */
int team_fork_join(TeamCtrl *c, int job, const int32_t *args, uint8_t *scratch, TeamJobs jobs);
void team_serve(TeamCtrl *c, uint8_t *scratch, TeamJobs jobs);

/* Row shares start at multiples of this: the matrix-vector kernels work on 4 rows at a time
 * and the dequantized tiles on 8, so an aligned cut gives each row the same code path (and
 * the same roundings) as the whole product has. */
#define TEAM_ROW_ALIGN 16

/* Busy-wait this many polls (about a millisecond) before sleeping in memory.atomic.wait32.
 * A step has ~100-120 barriers (4 a LLaMA block) a few hundred microseconds apart. On a quiet
 * machine the count does not matter once it covers a phase: under wasmtime, 2 threads, 2^16
 * and 2^24 polls both gave 59.7-60.8 tok/s on SmolLM2 Q4_1 and 13.0-13.3 on Qwen2.5-0.5B Q4_K_M
 * (one thread: 32.5-33.0 and 6.7-6.8). When other work shares the cores, long spinning burns
 * the time slice the other thread needs: at load 8-12, SmolLM2 on 2 threads ran 1.7 tok/s with
 * 2^24 polls and 10.7-11.4 with 2^16 (12-15 on one thread). (With 9 barriers a block, 2^24 had
 * measured better quietly: 19.3-19.7 ms a step against 27-32 ms.)
 * The helper also polls this long for the next step (the caller's Python between tokens takes
 * a few ms), then sleeps: an idle page costs no CPU. */
#define TEAM_SPINS (1 << 16)

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
