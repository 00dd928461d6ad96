/*
 * run.h — `cellm run` (tools/run.c) and `cellm perplexity`
 * (tools/perplexity.c).
 */
#ifndef CELLM_RUN_H
#define CELLM_RUN_H

int cmd_run(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);

#endif /* CELLM_RUN_H */
