/* The team's entry points (threads build only; see team.h): team_run on the calling thread,
 * team_worker on the helper's. Both run the job's step function with their own thread id and
 * scratch buffer, then meet at a final barrier, so team_run returns when the whole step is
 * done. Without a helper (none started, or it has not arrived yet) team_run runs the step
 * alone: the same numbers, one thread's time. */
#ifdef KERNELS_THREADS
#include "kernels.h"
#include "team.h"

static void run_job(int job, int tid, int nt, TeamCtrl *c, const int32_t *args,
                    uint8_t *scratch) {
    if (job == TEAM_JOB_LLAMA_STEP) llama_team_step(tid, nt, c, args, scratch);
    else if (job == TEAM_JOB_WHISPER_STEP) whisper_team_step(tid, nt, c, args, scratch);
    else if (job == TEAM_JOB_WHISPER_ENCODER) whisper_encoder_team_step(tid, nt, c, args, scratch);
}

/* Runs `job` on its argument block with the helper when it is there; returns the number of
 * threads that ran it. TEAM_JOB_STOP makes the helper leave team_worker (returns once it has). */
KERNEL int team_run(TeamCtrl *c, int job, const int32_t *args, uint8_t *scratch) {
    int nt = __atomic_load_n(&c->alive, __ATOMIC_ACQUIRE) ? 2 : 1;
    if (nt > 1) {
        c->job = job;
        c->args = (int32_t)(uintptr_t)args;
        c->nthreads = nt;
        __atomic_add_fetch(&c->generation, 1, __ATOMIC_ACQ_REL);
        __builtin_wasm_memory_atomic_notify(&c->generation, 1);
    }
    if (job == TEAM_JOB_STOP) {
        for (int spin = 0; __atomic_load_n(&c->alive, __ATOMIC_ACQUIRE); spin++)
            if (spin >= TEAM_SPINS) __builtin_wasm_memory_atomic_wait32(&c->alive, 1, 1000000);
        return nt;
    }
    run_job(job, 0, nt, c, args, scratch);
    team_barrier(c, nt);
    return nt;
}

/* The helper's loop: waits for a job, runs its share, meets the caller at the final barrier;
 * returns only for TEAM_JOB_STOP. */
KERNEL void team_worker(TeamCtrl *c, uint8_t *scratch) {
    int seen = __atomic_load_n(&c->generation, __ATOMIC_ACQUIRE);
    __atomic_store_n(&c->alive, 1, __ATOMIC_RELEASE);
    for (;;) {
        int now;
        for (int spin = 0; (now = __atomic_load_n(&c->generation, __ATOMIC_ACQUIRE)) == seen;
             spin++)
            if (spin >= TEAM_SPINS) __builtin_wasm_memory_atomic_wait32(&c->generation, seen, -1);
        seen = now;
        int job = c->job, nt = c->nthreads;
        if (job == TEAM_JOB_STOP) {
            __atomic_store_n(&c->alive, 0, __ATOMIC_RELEASE);
            __builtin_wasm_memory_atomic_notify(&c->alive, 1);
            return;
        }
        run_job(job, 1, nt, c, (const int32_t *)(uintptr_t)(uint32_t)c->args, scratch);
        __atomic_add_fetch(&c->jobs_done, 1, __ATOMIC_RELAXED);
        team_barrier(c, nt);
    }
}
#endif
