/* The team jobs the step files define (threads build; team.h): steps.c LLaMA's decode step,
 * whisper_steps.c Whisper's decoder step and encoder window. The job table (team_jobs.c)
 * registers them under their TEAM_JOB_* ids; team.c never names them. Each runs as thread
 * `tid` of `nt` on its argument block, as team.h's TeamJobs says. */
#ifndef CANDLE_KERNELS_STEP_JOBS_H
#define CANDLE_KERNELS_STEP_JOBS_H

#include "team.h"

void llama_team_step(int tid, int nt, TeamCtrl *team, const int32_t *args, uint8_t *scratch);
void whisper_team_step(int tid, int nt, TeamCtrl *team, const int32_t *args, uint8_t *scratch);
void whisper_encoder_team_step(int tid, int nt, TeamCtrl *team, const int32_t *args,
                               uint8_t *scratch);

#endif
