/* The threads build's entry points, team_run and team_worker, over the job table: job id ->
 * the step file's job (step_jobs.h).
 *
 * Why here and not in team.c: the step files call team.h's barrier, so team.c must not name
 * them (the team and the steps would depend on each other). This file knows both and binds
 * them: team.c's fork-join gets the table as a function pointer (team.h's TeamJobs) and calls
 * through it, so the files depend one way: this file -> team.c and the steps -> team.h.
 *
 * The table is a switch of calls, not an array of function pointers: clang turns a table of
 * constants (a switch returning pointers too) into a lookup array in memory, a data segment the
 * kernel modules must not have (scripts/wasm_check.py). The one pointer taken (run_job) puts
 * one entry in the module's own function table (an element segment; the table is neither
 * imported nor exported). */
#ifdef KERNELS_THREADS
#include "kernels.h"
#include "step_jobs.h"

static void run_job(int job, int tid, int nt, TeamCtrl *team, const int32_t *args,
                    uint8_t *scratch) {
    switch (job) {
        case TEAM_JOB_LLAMA_STEP: llama_team_step(tid, nt, team, args, scratch); break;
        case TEAM_JOB_WHISPER_STEP: whisper_team_step(tid, nt, team, args, scratch); break;
        case TEAM_JOB_WHISPER_ENCODER:
            whisper_encoder_team_step(tid, nt, team, args, scratch);
            break;
        default: break; /* TEAM_JOB_STOP, or an id no step file registered */
    }
}

/* Runs `job` on its argument block with the helper when it is there; returns the number of
 * threads that ran it. TEAM_JOB_STOP makes the helper leave team_worker (returns once it has). */
KERNEL int team_run(TeamCtrl *c, int job, const int32_t *args, uint8_t *scratch) {
    return team_fork_join(c, job, args, scratch, run_job);
}

/* The helper's loop: waits for a job, runs its share, meets the caller at the final barrier;
 * returns only for TEAM_JOB_STOP. */
KERNEL void team_worker(TeamCtrl *c, uint8_t *scratch) {
    team_serve(c, scratch, run_job);
}
#endif
