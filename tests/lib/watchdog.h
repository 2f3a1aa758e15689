/*
 * watchdog.h - a test that fails must fail, not hang (a worker that died
 * can leave the others waiting): an alarm armed around each test which,
 * when it fires, runs the program's clean-up (kill everything it started)
 * and exits 1.
 *
 * RPS_IT_WATCHDOG_S=seconds overrides every program's default (slower
 * fabrics, e.g. a TCG VM).
 */
#ifndef RPS_TESTS_WATCHDOG_H
#define RPS_TESTS_WATCHDOG_H

/* Install the handler: prog names the program in the message, default_s is
 * the limit per test, on_fire (async-signal-safe, may be NULL) runs before
 * the exit. */
void watchdog_init(const char *prog, unsigned default_s, void (*on_fire)(void));
/* Start the clock for one test (a CUnit setup calls it), and stop it. */
void watchdog_arm(void);
void watchdog_disarm(void);

#endif
