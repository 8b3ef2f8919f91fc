/* The team's fork-join (threads build only; see team.h): team_fork_join on the calling thread,
 * team_serve on the helper's. Both run the job's share with their own thread id and scratch
 * buffer, then meet at a final barrier, so team_fork_join returns when the whole step is done.
 * Without a helper (none started, or it has not arrived yet) it runs the step alone: the same
 * numbers, one thread's time. The jobs come as the job table's pointer (team_jobs.c, which
 * defines the exports over these two): this file names no step. */
#ifdef KERNELS_THREADS
#include "kernels.h"
#include "team.h"

/* Runs `job` on its argument block with the helper when it is there; returns the number of
 * threads that ran it. TEAM_JOB_STOP makes the helper leave team_serve (returns once it has). */
int team_fork_join(TeamCtrl *c, int job, const int32_t *args, uint8_t *scratch, TeamJobs jobs) {
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
    jobs(job, 0, nt, c, args, scratch);
    team_barrier(c, nt);
    return nt;
}

/* The helper's loop: waits for a job, runs its share, meets the caller at the final barrier;
 * returns only for TEAM_JOB_STOP. */
void team_serve(TeamCtrl *c, uint8_t *scratch, TeamJobs jobs) {
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
        jobs(job, 1, nt, c, (const int32_t *)(uintptr_t)(uint32_t)c->args, scratch);
        __atomic_add_fetch(&c->jobs_done, 1, __ATOMIC_RELAXED);
        team_barrier(c, nt);
    }
}
#endif
